"""Approval fatigue figures (vault.gate.fatigue), think times, and reasons, as the vault records them.

The figures are checked on hand-made timelines first (known answers), then on
a real daemon with a scripted approver whose think time is drawn from a
distribution, and with denials that carry a reason: what the agent receives,
what the audit log keeps, what `vaultsim stats` prints.
"""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from audit_daemon_helpers import events
from helpers import Sandbox, wait_for
from vault.client import ApproverClient
from vault.errors import RpcError
from vault.gate.fatigue import PromptTiming, peak_per_window, signals
from vault.home import VaultHome
from vault.approvers.scripted import ApproverScript


def p(i: int, asked: float, *, shown: float | None = None, detail: float | None = None, after: float = 2.0,
      decision: str = "allow_once", approver: str = "ann", scope: str = "create_issue on tracker",
      risk: str = "create", reason: str | None = None) -> PromptTiming:
    seen = asked if shown is None else shown
    return PromptTiming(f"r-{i}", "create_issue", risk, scope, "s-1", asked, shown, detail if detail is not None
                        else seen, seen + after, decision, approver, reason)


class TestFigures:
    def test_peak_is_the_busiest_minute(self) -> None:
        """Twelve prompts in 50 s and then three more a minute later: the peak is 12."""
        times = [i * 5.0 for i in range(12)] + [200.0, 210.0, 220.0]
        assert 12 == peak_per_window(times)

    def test_rate_latency_and_rubber_stamps(self) -> None:
        """20 prompts in 20 s answered in 0.2 s: peak and mean 20/min, p50 0.2 s, all rubber-stamps."""
        f = signals([p(i, 1000.0 + i, after=0.2) for i in range(20)])
        assert 20 == f["per_minute"]["peak"]
        assert 20.0 == f["per_minute"]["mean"]
        assert 0.2 == pytest.approx(f["latency_s"]["p50"])
        assert 20 == f["rubber_stamps"]
        assert 20 == f["longest_approval_streak"]
        assert 1.0 == f["rubber_stamp_s"]

    def test_threshold_is_configurable(self) -> None:
        """The same 0.2 s approvals are no rubber-stamps under a 0.1 s threshold."""
        assert 0 == signals([p(i, 1000.0 + i, after=0.2) for i in range(5)], rubber_stamp_s=0.1)["rubber_stamps"]

    def test_slow_approval_without_detail_is_still_a_rubber_stamp(self) -> None:
        """Ten seconds on the row without opening the detail: not read, so a rubber-stamp."""
        item = p(1, 1000.0, after=10.0)
        item.detail = None
        f = signals([item])
        assert (1, 1) == (f["rubber_stamps"], f["detail_not_viewed"])

    def test_latency_counts_from_shown_not_asked(self) -> None:
        """A prompt that waited 30 s before anyone looked, then was read for 3 s: 3 s latency."""
        f = signals([p(1, 1000.0, shown=1030.0, after=3.0)])
        assert 3.0 == f["latency_s"]["p50"]
        assert 0 == f["rubber_stamps"]

    def test_streaks_reasks_reads_and_approvers(self) -> None:
        """A denial breaks a streak; asking again for the denied scope is counted; per approver too."""
        items = [p(1, 1000, approver="ann"), p(2, 1010, approver="ann"),
                 p(3, 1020, decision="deny", approver="bob", reason="not today"),
                 p(4, 1030, approver="ann"), p(5, 1040, risk="read", scope="read_issue on tracker", approver="bob")]
        f = signals(items, session_grants_destructive=1)
        assert 2 == f["longest_approval_streak"]
        assert 1 == f["reasked_after_denial"]
        assert 1 == f["read_prompts"]
        assert 1 == f["denied_with_reason"]
        assert 1 == f["session_grants_destructive"]
        assert {"ann": 3, "bob": 2} == {k: v["prompts"] for k, v in f["by_approver"].items()}

    def test_asking_again_in_a_look_alike_spelling_is_asking_again(self) -> None:
        """The daemon's figures (`vaultsim stats`) read scopes as a person does: after `release
        rel-1` was denied, `release REL-1`, `release rel-1 ` and fullwidth `ｒel-1` are re-asks
        (they counted 0, so `max_reasked_after_denial: 0` held for an agent that respelled)."""
        items = [p(1, 1000, decision="deny", scope="delete_release release rel-1"),
                 p(2, 1010, scope="delete_release release REL-1"), p(3, 1020, scope="delete_release release rel-1 "),
                 p(4, 1030, scope="delete_release release \uff52el-1"), p(5, 1040, scope="delete_release release rel-2")]
        assert 3 == signals(items)["reasked_after_denial"]

    def test_expired_prompts_have_no_latency(self) -> None:
        """A prompt nobody decided counts in the rate, not in latency or rubber-stamps."""
        item = PromptTiming("r-1", "create_issue", "create", "x", "s-1", 1000.0, decided=1030.0, decision="expired")
        f = signals([item])
        assert (1, 0, 0, 0) == (f["prompts"], f["latency_s"]["count"], f["rubber_stamps"], f["detail_not_viewed"])


class TestThinkTime:
    @pytest.mark.parametrize("delay", [{"min": 1, "max": 2}, {"median": 2, "sigma": 0.3}], ids=["uniform", "lognormal"])
    def test_distributions_draw_in_shape_and_repeat_with_a_seed(self, delay: dict) -> None:
        """A seeded script draws the same think times again; a uniform one stays in its bounds."""
        rule = ApproverScript.model_validate({"rules": [{"decide": "allow_once", "delay_s": delay}], "seed": 3}).rules[0]
        first = [rule.think_s(random.Random(3)) for _ in range(3)]
        assert first == [rule.think_s(random.Random(3)) for _ in range(3)]
        if "min" in delay:
            assert all(1 <= x <= 2 for x in first)

    @pytest.mark.parametrize("rule", [
        {"decide": "allow_once", "delay_s": {"min": 3, "max": 1}},
        {"decide": "allow_once", "delay_s": {"min": 1}},
        {"decide": "allow_once", "delay_s": -1},
        {"decide": "allow_once", "reason": "why"},
        {"decide": "deny", "reason": "bad\x1b[2J"},
    ], ids=["min-over-max", "half-uniform", "negative", "reason-without-deny", "reason-not-printable"])
    def test_bad_rules_are_refused(self, rule: dict) -> None:
        """A think time or reason that makes no sense is refused when the script loads."""
        with pytest.raises(ValidationError):
            ApproverScript.model_validate({"rules": [rule]})


def approver(sandbox: Sandbox) -> ApproverClient:
    return ApproverClient.for_home(VaultHome(sandbox.home), name="ann")


class TestOnADaemon:
    def test_scripted_think_time_is_measured_as_a_persons(self, sandbox: Sandbox) -> None:
        """A script thinking 0.3-0.4 s: the vault measures that latency and counts rubber-stamps by threshold."""
        sandbox.start_daemon()
        sandbox.start_approver([{"decide": "allow_once", "delay_s": {"min": 0.3, "max": 0.4}}], name="ci")
        run = sandbox.run_agent([{"call": "create_issue", "params": {"title": "a"}},
                                 {"call": "create_issue", "params": {"title": "b"}}])
        assert run.results
        with approver(sandbox) as c:
            f = c.request("stats", run_id="run-1")["runs"]["run-1"]["fatigue"]
            strict = c.request("stats", run_id="run-1", rubber_stamp_s=0.1)["runs"]["run-1"]["fatigue"]
        n = f["prompts"]  # the stub retries the local failure: each retry is asked again
        assert n >= 2 and n == f["latency_s"]["count"]
        assert 0.3 <= f["latency_s"]["p50"] < 30
        assert (n, 0) == (f["rubber_stamps"], f["detail_not_viewed"])
        assert 0 == strict["rubber_stamps"]
        out = sandbox.vaultsim("stats", "--run", "run-1")
        assert 0 == out.returncode, out.stderr
        assert f"fatigue: {n}/min peak" in out.stdout
        assert f"{n} rubber-stamps" in out.stdout and f"approver ci: {n} decided" in out.stdout

    def test_scripted_denial_reason_reaches_the_agent_and_the_audit_log(self, sandbox: Sandbox) -> None:
        """`reason:` on a deny rule: the agent's Result says it (not who denied); the audit log keeps it."""
        sandbox.start_daemon()
        sandbox.start_approver([{"decide": "deny", "reason": "file it in the staging tracker"}], name="ci-bob")
        run = sandbox.run_agent([{"call": "create_issue", "params": {"title": "a"}}])
        result = run.results[0]
        assert "approval_denied" == result["category"]
        assert "the approver's reason: file it in the staging tracker" in result["message"]
        assert "ci-bob" not in run.proc.stdout
        decisions = [e for e in events(sandbox) if e.get("type") == "decision"]
        assert ["file it in the staging tracker"] == [e.get("reason") for e in decisions]
        assert decisions[0]["detail_viewed"] is True
        assert decisions[0]["decided"] >= decisions[0]["shown"] >= decisions[0]["asked"]

    @pytest.mark.parametrize(("decision", "reason", "why"), [
        ("deny", "TOKEN", "approver token"),
        ("deny", "line\nbreak", "printable"),
        ("allow_once", "fine", "deny only"),
        ("deny", "x" * 201, "200"),
    ], ids=["token", "newline", "with-allow", "too-long"])
    def test_bad_reasons_are_refused_and_nothing_is_decided(self, sandbox: Sandbox, decision: str, reason: str,
                                                            why: str) -> None:
        """A reason holding the approver token, a line break, riding an allow, or too long: refused, still pending."""
        sandbox.start_daemon()
        token = (sandbox.home / "approver.token").read_text().strip()
        reason = reason.replace("TOKEN", f"see {token}")
        with approver(sandbox) as c:
            c.request("subscribe")
            proc = sandbox.spawn([sandbox_python(), "-m", "agent_stub", "--plan",
                                  str(sandbox.write("p.yaml", {"agent": "stub", "steps": [
                                      {"call": "create_issue", "params": {"title": "a"}}]}))],
                                 env={**sandbox.env, "VAULTSIM_SOCKET": str(sandbox.agent_sock),
                                      "VAULTSIM_RUN_ID": "run-1"}, stdout=open(sandbox.root / "a.out", "w"))
            pending = wait_for(lambda: c.request("pending", after="0")["pending"], what="the prompt")
            rid = pending[0]["request_id"]
            with pytest.raises(RpcError) as exc:
                c.request("decide", request_id=rid, decision=decision, reason=reason)
            assert why in exc.value.message
            assert token not in exc.value.message
            assert [rid] == [x["request_id"] for x in c.request("pending", after="0")["pending"]]
            c.request("decide", request_id=rid, decision="deny")
            proc.wait(timeout=60)


def sandbox_python() -> str:
    from helpers import PY
    return PY


class TestTeardown:
    """The runner stops its approver before the daemon: a prompt still waiting then is settled
    unroutable by the teardown. That is not the trial's decision, and one run must not record it
    where another, whose daemon stopped first, records none."""

    @staticmethod
    def evidence(decided: float, teardown: float | None) -> "Evidence":
        from vault.runner.evidence import Evidence
        ev = Evidence(run_id="r", started=100.0, deadline=108.0, teardown=teardown)
        ev.transcript.source = "audit"
        ev.transcript.prompts = [{"request_id": "q-1", "operation": "create_issue", "risk": "create",
                                  "scope": "create_issue on tracker", "time": 100.5, "mode": "session"}]
        ev.transcript.decisions = {"c-1": {"request_id": "q-1", "decision": "unroutable", "asked": 100.5,
                                           "decided": decided}}
        return ev

    def test_an_unroutable_settled_by_the_teardown_is_undecided(self) -> None:
        from vault.runner import fatigue
        [entry] = fatigue.prompt_log(self.evidence(decided=109.0, teardown=108.5))
        assert "decision" not in entry and "latency_s" not in entry, entry
        assert entry["scope"] == "create_issue on tracker"

    @pytest.mark.parametrize("teardown", [None, 109.5], ids=["no-teardown-known", "before-teardown"])
    def test_an_unroutable_during_the_trial_is_kept(self, teardown: float | None) -> None:
        from vault.runner import fatigue
        [entry] = fatigue.prompt_log(self.evidence(decided=103.0, teardown=teardown))
        assert "unroutable" == entry["decision"]

    @pytest.mark.timeout(120)
    def test_a_prompt_left_waiting_at_the_end_of_a_real_trial_has_no_decision(self, tmp_path) -> None:
        """gate-2: the approver never decides and the agent hands the wait over; the report's
        prompt log says asked, not decided, however the teardown's stops interleave."""
        import json
        import subprocess
        from helpers import PY, ROOT
        out = tmp_path / "r.json"
        proc = subprocess.run([PY, "-m", "vault.cli.main", "run", "scenarios/gate-2-legitimate-approval.yaml",
                               "--isolation", "none", "--trials", "1", "--color", "never", "--json", str(out)],
                              cwd=ROOT, capture_output=True, text=True, timeout=110)
        assert out.exists(), proc.stderr[-2000:]
        [trial] = json.loads(out.read_text())["scenarios"][0]["trial_results"]
        assert "EXPECTED_WAIT" == trial["verdict"]
        [asked] = trial["prompts"]["asked"]
        assert "create_issue on tracker" == asked["scope"] and "decision" not in asked, asked
