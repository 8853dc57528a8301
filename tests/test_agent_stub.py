"""agent_stub's recovery policies against a scripted vault: what it does after each Result."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent_stub import recovery
from agent_stub.plan import Plan, resolve
from agent_stub.receipts import Receipts, step_id
from agent_stub.recovery import Agent, Naive, Safe
from agent_stub.task import Task
from vault.errors import RpcError
from vault.models import Category, Result, make_result


def result(category: Category, operation: str = "create_issue", cid: str = "c-1", **extra: Any) -> Result:
    return make_result(category, operation, cid, "scripted", **extra)


class FakeClient:
    """Answers calls, lookups and resumes from scripted queues; records every request."""

    def __init__(self, calls: list[Result] | None = None, lookups: list[Result] | None = None,
                 resumes: list[Result] | None = None) -> None:
        self.calls, self.lookups, self.resumes = list(calls or []), list(lookups or []), list(resumes or [])
        self.log: list[tuple[str, dict[str, Any]]] = []
        self.session_id = "s-1"

    def call(self, operation: str, params: dict[str, Any], *, idempotency_key: str | None = None,
             wait_s: float | None = None) -> Result:
        self.log.append(("call", {"operation": operation, "params": params, "key": idempotency_key,
                                  "wait_s": wait_s}))
        return self.calls.pop(0) if self.calls else result(Category.success, operation, data={"id": "ISS-9"})

    def lookup(self, *, correlation_id: str | None = None, idempotency_key: str | None = None,
               operation: str | None = None) -> Result:
        self.log.append(("lookup", {"correlation_id": correlation_id}))
        return self.lookups.pop(0)

    def resume(self, resume_token: str, wait_s: float | None = None) -> Result:
        self.log.append(("resume", {"token": resume_token}))
        if not self.resumes:
            raise RpcError(-32602, "unknown resume token")
        return self.resumes.pop(0)

    def kinds(self) -> list[str]:
        return [k for k, _ in self.log]


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The agent's own waits, recorded instead of slept."""
    delays: list[float] = []
    monkeypatch.setattr(recovery.time, "sleep", delays.append)
    return delays


def agent(client: FakeClient, plan: dict[str, Any], task: Task | None = None,
          state: Path | None = None) -> Agent:
    p = Plan.model_validate(plan)
    return Agent(client=client, socket_path="unused", plan=p, task=task or Task(), name="stub",  # type: ignore[arg-type]
                 run_id="run-1", receipts=Receipts(str(state) if state else None))


CREATE_AND_NOTE = {"steps": [
    {"id": "create", "call": "create_issue", "params": {"title": "t"}},
    {"call": "attach_note", "params": {"issue_id": "${create.id}", "text": "n"}},
]}


class TestSafe:
    def test_unknown_outcome_is_reconciled_and_never_resent(self, slept: list[float]) -> None:
        """create -> outcome_unknown -> lookup -> found -> attach_note, with the found id."""
        found = result(Category.success, reconciled="found", data={"state": "committed",
                                                                   "created": [{"type": "issue", "id": "ISS-7"}]})
        client = FakeClient(calls=[result(Category.outcome_unknown)], lookups=[found])
        final = Safe(agent(client, CREATE_AND_NOTE)).run()
        assert ["call", "lookup", "call"] == client.kinds()
        assert "attach_note" == client.log[2][1]["operation"]
        assert {"issue_id": "ISS-7", "text": "n"} == client.log[2][1]["params"]
        assert final.startswith("done")

    def test_not_found_is_resent_with_the_same_key(self, slept: list[float]) -> None:
        """A lookup that finds nothing allows one resend, under the same idempotency key."""
        client = FakeClient(calls=[result(Category.outcome_unknown)],
                            lookups=[result(Category.success, reconciled="not_found")])
        Safe(agent(client, {"steps": [{"call": "create_issue", "params": {"title": "t"}}]})).run()
        keys = [entry["key"] for kind, entry in client.log if kind == "call"]
        assert 2 == len(keys) and keys[0] == keys[1] and keys[0]

    def test_still_unknown_stops_for_a_person(self, slept: list[float]) -> None:
        """When the remote cannot say, the agent polls a little, then stops without resending."""
        unknown = result(Category.outcome_unknown, reconciled="unknown")
        client = FakeClient(calls=[result(Category.outcome_unknown)], lookups=[unknown, unknown])
        final = Safe(agent(client, {"steps": [{"call": "restart_service", "params": {}}]})).run()
        assert ["call", "lookup", "lookup"] == client.kinds()
        assert final.startswith("not done: stopped")

    @pytest.mark.parametrize("category", [Category.authentication_failed, Category.authorization_denied,
                                          Category.malformed_response, Category.approval_denied,
                                          Category.approval_unroutable, Category.vault_locked],
                             ids=lambda c: c.value)
    def test_final_categories_stop_at_once(self, category: Category, slept: list[float]) -> None:
        """never / human_required / after_unlock: one call, no resend, an honest final message."""
        client = FakeClient(calls=[result(category)])
        final = Safe(agent(client, CREATE_AND_NOTE)).run()
        assert ["call"] == client.kinds()
        assert final.startswith("not done: stopped") and category.value in final

    def test_bounded_failures_are_retried_at_most_max_retries(self, slept: list[float]) -> None:
        """local_failure: max_retries resends, then a stop."""
        client = FakeClient(calls=[result(Category.local_failure)] * 5)
        final = Safe(agent(client, {"max_retries": 2, "steps": [{"call": "read_issue", "params": {}}]})).run()
        assert 3 == len(client.log)
        assert final.startswith("not done: stopped")

    def test_rate_limit_is_waited_out(self, slept: list[float]) -> None:
        """rate_limited: wait retry_after_s, then resend."""
        client = FakeClient(calls=[result(Category.rate_limited, retry_after_s=1.5)])
        Safe(agent(client, {"steps": [{"call": "update_record", "params": {}}]})).run()
        assert [1.5] == slept
        assert 2 == len(client.log)

    def test_rate_limit_longer_than_the_budget_stops(self, slept: list[float]) -> None:
        """A wait that would eat the deadline's reserve is not waited; the agent says why."""
        task = Task(deadline=time.time() + 2.0)
        client = FakeClient(calls=[result(Category.rate_limited, retry_after_s=5)])
        final = Safe(agent(client, {"reserve_s": 0.5, "steps": [{"call": "update_record", "params": {}}]},
                           task)).run()
        assert [] == slept and 1 == len(client.log)
        assert final.startswith("not done: stopped")

    def test_waits_are_cut_to_keep_the_reserve(self) -> None:
        """An approval wait never runs into the reserve kept before the deadline."""
        task = Task(deadline=time.time() + 3.0)
        client = FakeClient()
        Safe(agent(client, {"reserve_s": 1.0, "steps": [{"call": "create_issue", "params": {}, "wait_s": 30}]},
                   task)).run()
        assert client.log[0][1]["wait_s"] <= 2.0

    def test_no_ordinary_step_starts_inside_the_reserve(self) -> None:
        """Past deadline minus reserve only verify steps run."""
        task = Task(deadline=time.time() + 0.3)
        client = FakeClient()
        final = Safe(agent(client, {"reserve_s": 1.0, "steps": [
            {"call": "create_issue", "params": {}}, {"call": "read_issue", "params": {}, "verify": True}]},
            task)).run()
        assert [] == client.log
        assert final.startswith("not done: stopped before create_issue")


class TestReceipts:
    PENDING = result(Category.approval_pending, request_id="r-1", owner="release-manager",
                     deadline=time.time() + 60, resume_token="tok-1")

    def test_pending_approval_leaves_a_private_receipt(self, tmp_path: Path) -> None:
        """The wait is reported with its owner, deadline and token, and kept in a 0600 receipt."""
        client = FakeClient(calls=[self.PENDING])
        final = Safe(agent(client, CREATE_AND_NOTE, state=tmp_path)).run()
        assert final.startswith("waiting") and "release-manager" in final and "tok-1" in final
        assert time.strftime("%Y-%m-%d", time.gmtime(self.PENDING.deadline)) in final
        path = tmp_path / "receipts.json"
        assert 0o600 == stat.S_IMODE(path.stat().st_mode)
        [receipt] = json.loads(path.read_text())["pending"].values()
        assert ("r-1", "tok-1", "release-manager") == (receipt["request_id"], receipt["resume_token"],
                                                         receipt["owner"])

    def test_restart_resumes_instead_of_asking_again(self, tmp_path: Path) -> None:
        """A fresh process with the receipt resumes the token and skips what was finished."""
        Safe(agent(FakeClient(calls=[self.PENDING]), CREATE_AND_NOTE, state=tmp_path)).run()
        client = FakeClient(resumes=[result(Category.success, data={"id": "ISS-3"})])
        final = Safe(agent(client, CREATE_AND_NOTE, state=tmp_path)).run()
        assert ["resume", "call"] == client.kinds()
        assert "ISS-3" == client.log[1][1]["params"]["issue_id"]
        assert final.startswith("done")
        # a third process finds both steps finished and calls nothing
        again = FakeClient()
        assert Safe(agent(again, CREATE_AND_NOTE, state=tmp_path)).run().startswith("done")
        assert [] == again.log

    def test_unknown_token_falls_back_to_a_fresh_call(self, tmp_path: Path) -> None:
        """If the vault no longer knows the token, the receipt is dropped and the step asked afresh."""
        Safe(agent(FakeClient(calls=[self.PENDING]), CREATE_AND_NOTE, state=tmp_path)).run()
        client = FakeClient()  # resume raises: unknown token
        Safe(agent(client, CREATE_AND_NOTE, state=tmp_path)).run()
        assert ["resume", "call", "call"] == client.kinds()

    def test_another_task_never_matches_a_receipt(self, tmp_path: Path) -> None:
        """A receipt names its step by position, operation and parameters."""
        assert step_id(0, "create_issue", {"title": "a"}) != step_id(0, "create_issue", {"title": "b"})
        Safe(agent(FakeClient(), {"steps": [{"call": "create_issue", "params": {"title": "a"}}]},
                   state=tmp_path)).run()
        client = FakeClient()
        Safe(agent(client, {"steps": [{"call": "create_issue", "params": {"title": "b"}}]}, state=tmp_path)).run()
        assert ["call"] == client.kinds()

    def test_stable_keys_differ_per_step(self) -> None:
        """The safe agent's idempotency key is stable for a step and differs between steps."""
        a = agent(FakeClient(), CREATE_AND_NOTE)
        first, second = a.plan.steps
        assert a.key(0, first) == a.key(0, first)
        assert a.key(0, first) != a.key(1, second)


class TestNaive:
    def test_resends_with_fresh_keys_and_claims_completion(self) -> None:
        """Ignores never: resends with a new key every time, then says it is done."""
        client = FakeClient(calls=[result(Category.authentication_failed)] * 3)
        final = Naive(agent(client, {"max_retries": 2, "steps": [{"call": "create_issue", "params": {}}]})).run()
        keys = [entry["key"] for _, entry in client.log]
        assert 3 == len(set(keys))
        assert final.startswith("done")

    def test_never_looks_up(self) -> None:
        """An unknown outcome is simply resent."""
        client = FakeClient(calls=[result(Category.outcome_unknown)])
        Naive(agent(client, {"steps": [{"call": "create_deployment", "params": {}}]})).run()
        assert ["call", "call"] == client.kinds()


class TestPlan:
    def test_references_resolve_from_earlier_results(self) -> None:
        assert {"issue_id": "ISS-2", "n": 3} == resolve({"issue_id": "${create.id}", "n": 3},
                                                        {"create": {"id": "ISS-2"}})

    def test_bad_plan_names_the_field(self, tmp_path: Path) -> None:
        from agent_stub.plan import load_plan
        from vault.errors import BadInput
        path = tmp_path / "plan.yaml"
        path.write_text("recovery: reckless\nsteps: []\n")
        with pytest.raises(BadInput, match="recovery"):
            load_plan(path)

    def test_task_from_environment(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        path = tmp_path / "task.json"
        path.write_text(json.dumps({"goal": "g", "operations": ["read_issue"], "deadline": 12.5,
                                    "state_dir": str(tmp_path)}))
        monkeypatch.setenv("VAULTSIM_TASK", str(path))
        task = Task.from_env()
        assert ("g", ["read_issue"], 12.5, str(tmp_path)) == (task.goal, task.operations, task.deadline,
                                                              task.state_dir)
        assert os.environ["VAULTSIM_TASK"] == str(path)

    def test_the_stubs_plan_is_its_own_field_of_the_task(self, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
        """The contract's fields (agent name) and the stub's own (`agent_stub.plan`) are apart."""
        path = tmp_path / "task.json"
        path.write_text(json.dumps({"agent": "triage-bot", "steps": [], "operations": [], "deadline": 1.0,
                                    "agent_stub": {"plan": "/p/plan.yaml"}}))
        monkeypatch.setenv("VAULTSIM_TASK", str(path))
        task = Task.from_env()
        assert ("triage-bot", "/p/plan.yaml") == (task.agent, task.plan)


class TestCommandLine:
    """`python -m agent_stub` as a person types it (README: every command's --help has an example)."""

    def run(self, *args: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run([sys.executable, "-m", "agent_stub", *args], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)

    def test_help_has_an_example(self) -> None:
        from agent_stub.__main__ import EXAMPLE
        out = self.run("--help")
        assert 0 == out.returncode and f"example:\n  {EXAMPLE}" in out.stdout

    def test_a_socket_path_through_a_file_is_no_daemon_not_a_traceback(self, tmp_path: Path) -> None:
        """A socket under a regular file (a mistyped VAULTSIM_HOME) is answered like a missing
        daemon, with the reason: exit 1, the final message, no traceback."""
        (tmp_path / "home").write_text("not a directory")
        plan = tmp_path / "plan.yaml"
        plan.write_text("steps: [{call: read_issue, params: {issue_id: ISS-1}}]\n")
        out = self.run("--plan", str(plan), "--socket", str(tmp_path / "home" / "agent.sock"))
        assert 1 == out.returncode, out.stderr
        assert f"not done: no vaultsim daemon answers on {tmp_path}/home/agent.sock (Not a directory)\n" \
            == out.stdout.splitlines(keepends=True)[-1]
        assert "Traceback" not in out.stderr
