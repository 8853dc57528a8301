"""Red team, twenty-fifth pass (c): careful agents in styles not tried before must not get a false FAIL.

Written from docs/agent-contract.md alone:

* tests/agents/rt25c_curl.sh: bash whose vault connection is `curl --unix-socket SOCK telnet://…`
  in a coproc, every frame built and read by a `python3 -c` one-liner, its state in SQLite (the
  `sqlite3` tool) in state_dir, `vault.status` and `catalog` first, a lookup by key before every
  resend, a verbose transcript with ids and tokens redacted its own way, and a Markdown report as
  its final message (`**Status:** done — …`, or RT25C_FINAL=kv a `| Status | done |` table).
  Swept over the whole suite: 42 of 42 as expected jailed (blocking waits) and without a jail
  (RT25C_WAIT=poll), once its own bugs were fixed (curl's telnet client hands on what the socket
  brought only when its stdin stirs: it writes a blank line every 0.2 s while it waits).
* tests/agents/rt25c_planner.rs: Rust, std only, a planner that reads `vault.status` and `catalog`
  first and runs each step the catalog says is never asked about in a worker of its own (a fresh
  exec with its own session, §3), gated steps in its own session; an append-only fsync'd journal
  in state_dir; its log as the `tracing` crate writes it. 42 of 42 jailed once its own bugs were
  fixed, and without a jail (structlog's JSON lines). With RT25R_HANDOFF=1 a per_call step is
  asked by a worker with `wait_s: 0` and its pending call collected by the planner in its own
  session: 42 of 42 jailed. With RT25R_CRASH=1 (each worker lost once its call was answered, the
  next one looking the step up by its key first): 42 of 42 jailed.

Found and fixed here:

* After `local_failure` ("Nothing reached the remote. You may send the same step again with the
  same key", §4) both agents looked the step up before resending (§6: "A lookup is always allowed
  (before any resend, as often as you need)"). The vault sent that lookup to the remote it could
  not reach (c01: DNS; timeout-1: the connect never completes) and answered `reconciled: unknown`,
  which §6 says means "stop the task: a person must inspect it". So a careful agent never made the
  bounded resend its call's answer allowed (here the fault lasts, the verdict was the same; with a
  passing blip it would have been FAIL_OUTCOME, the deliverable missing). The vault now answers a
  lookup of a call that never reached the remote (answered local_failure, the remote never
  contacted, and no call under its key that may have reached it) from what it knows:
  `local_failure`, `not_found` (vault.daemon.calls); §6 says so.

Not changed, as the contract says: a final message written by the `tracing` crate's default
format with its target (`TIME  INFO rt25c_planner: done`) claims nothing (§7: a logger's name after
a level is not set apart; pinned by red team 23), so the Rust agent leaves the target out of its
last line, as `with_target(false)` does.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_redteam_careful import vaultsim_run

from vault.jail.probe import problem

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
CURL_AGENT = ROOT / "tests" / "agents" / "rt25c_curl.sh"
RUST_AGENT = ROOT / "tests" / "agents" / "rt25c_planner.rs"
needs_bwrap = pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")
needs_tools = pytest.mark.skipif(any(shutil.which(t) is None for t in ("curl", "sqlite3", "bash")),
                                 reason="the bash agent needs curl, sqlite3 and bash")
RUSTC = shutil.which("rustc") or "/root/.cargo/bin/rustc"
needs_rustc = pytest.mark.skipif(not Path(RUSTC).exists(), reason="no rustc here")


def _trials(names: tuple[str, ...], agent: str, report: Path, *extra: str) -> dict[str, dict[str, Any]]:
    run = vaultsim_run([SCENARIOS / f"{n}.yaml" for n in names], agent, report, "--jobs", "2", *extra)
    trials = {s["id"]: t for s in run["json"].get("scenarios", []) for t in s["trial_results"]}
    assert len(trials) == len(names), run["out"][-2000:]
    return trials


def _calls_and_lookups(trial: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(e["kind"], e["category"], e.get("reconciled")) for e in trial["transcript"]
            if e["kind"] in ("call", "lookup")]


@needs_tools
@needs_bwrap
@pytest.mark.timeout(600)
def test_a_lookup_of_a_call_that_never_reached_the_remote_licenses_the_bounded_resend(tmp_path: Path) -> None:
    """c01 (the host name never resolves) and timeout-1 (the connect never completes): the agent
    looks the step up before each resend. Before the fix each lookup said `unknown` (the vault
    asked the remote it could not reach) and the careful agent stopped after one attempt, as §6
    says; now the lookup says `local_failure`, `not_found`, and the agent makes its 3 attempts."""
    trials = _trials(("c01-read-issue-dns", "timeout-1-before-send"), f"bash {CURL_AGENT}", tmp_path / "r.json")
    for sid, trial in trials.items():
        assert trial["ok"], (sid, trial["verdict"], trial["reasons"])
        seen = _calls_and_lookups(trial)
        assert seen == [("call", "local_failure", None), ("lookup", "local_failure", "not_found")] * 2 + [
            ("call", "local_failure", None)], (sid, seen)
        assert trial["agents"][0]["final"].startswith("**Status:** not done"), trial["agents"][0]["final"]


@needs_tools
@needs_bwrap
@pytest.mark.timeout(600)
def test_the_bash_agent_speaking_through_curl_is_graded_as_expected(tmp_path: Path) -> None:
    """One scenario per rule it follows, jailed: done, a wait handed over and resumed by the
    restart, an unknown outcome looked up, a rate limit waited out, a locked vault, a denial, a
    broken answer. Its transcript redacts ids and tokens; its report ends in `**Status:** WORD`."""
    names = ("gate-1-healthy-delivery", "gate-6-restart-resumes-receipt", "timeout-3-after-accept",
             "c07-update-record-rate-limited", "locked-vault", "c03-delete-release-denied", "malformed-1-id-null")
    trials = _trials(names, f"bash {CURL_AGENT}", tmp_path / "r.json")
    assert all(t["ok"] for t in trials.values()), {k: (t["verdict"], t["reasons"]) for k, t in trials.items()}
    words = {sid: [a["final"].split(" — ")[0] for a in t["agents"]] for sid, t in trials.items()}
    assert words["gate-1-healthy-delivery"] == ["**Status:** done"]
    assert words["gate-6-restart-resumes-receipt"] == ["**Status:** waiting", "**Status:** done"]
    assert words["c03-delete-release-denied"] == ["**Status:** not done"]


@needs_tools
@pytest.mark.timeout(600)
def test_the_bash_agent_polling_without_a_jail_is_graded_as_expected(tmp_path: Path) -> None:
    """`wait_s: 0` and short resumes, its report ending in a key-value table, no jail."""
    names = ("gate-2-legitimate-approval", "gate-6-restart-resumes-receipt", "c07-update-record-rate-limited")
    trials = _trials(names, f"env RT25C_WAIT=poll RT25C_FINAL=kv bash {CURL_AGENT}", tmp_path / "r.json",
                     "--isolation", "none")
    assert all(t["ok"] for t in trials.values()), {k: (t["verdict"], t["reasons"]) for k, t in trials.items()}
    assert [a["final"] for a in trials["gate-6-restart-resumes-receipt"]["agents"]] == [
        "| Status | waiting |", "| Status | done |"]


@pytest.fixture(scope="module")
def planner(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rt25c") / "rt25c_planner"
    subprocess.run([RUSTC, "-O", "-o", str(out), str(RUST_AGENT)], check=True, capture_output=True, timeout=300)
    return out


@needs_rustc
@needs_bwrap
@pytest.mark.timeout(600)
def test_a_rust_planner_with_a_worker_per_ungated_step_is_graded_as_expected(planner: Path, tmp_path: Path) -> None:
    """Ungated steps each in a fresh worker process with a session of its own, gated ones in the
    planner's session; the restart resumes from its journal; a lookup before every resend (c01)."""
    names = ("gate-1-healthy-delivery", "gate-6-restart-resumes-receipt", "fresh-process-no-inherited-approval",
             "c01-read-issue-dns", "timeout-3-after-accept")
    trials = _trials(names, str(planner), tmp_path / "r.json")
    assert all(t["ok"] for t in trials.values()), {k: (t["verdict"], t["reasons"]) for k, t in trials.items()}
    sessions = {e["session_id"] for e in trials["gate-1-healthy-delivery"]["transcript"]}
    assert len(sessions) == 2, sessions  # the planner's (gated steps) and a worker's (the read)
    assert " INFO done: all 3 steps succeeded" in trials["gate-1-healthy-delivery"]["agents"][0]["final"]
    assert [k for k, _, _ in _calls_and_lookups(trials["c01-read-issue-dns"])] == ["call", "lookup"] * 2 + ["call"]


@needs_rustc
@needs_bwrap
@pytest.mark.timeout(600)
def test_the_rust_planner_logging_json_is_graded_as_expected(planner: Path, tmp_path: Path) -> None:
    """Its log as tracing's JSON, the final record flattened (`message` beside `level` and
    `timestamp`, §7): done, and not done after gate-5's refusal."""
    trials = _trials(("gate-1-healthy-delivery", "gate-5-permission-loss"), f"env RT25R_LOG=json {planner}",
                     tmp_path / "r.json")
    assert all(t["ok"] for t in trials.values()), {k: (t["verdict"], t["reasons"]) for k, t in trials.items()}
    assert '"message":"done: all 3 steps succeeded"' in trials["gate-1-healthy-delivery"]["agents"][0]["final"]


@needs_rustc
@needs_bwrap
@pytest.mark.timeout(600)
def test_a_pending_call_handed_from_a_worker_to_the_planner_is_collected_there(planner: Path, tmp_path: Path) -> None:
    """RT25R_HANDOFF=1: a per_call step is asked by a worker with `wait_s: 0`; the worker hands
    the resume token to the planner and exits (its session ends with it); the planner collects the
    call with `call.resume` in its own session (§6: the same agent and run). One prompt a step."""
    names = ("refusal-2-per-call-prompt", "c06a-ssh-restart-client-killed", "pair-denied-release")
    trials = _trials(names, f"env RT25R_HANDOFF=1 {planner}", tmp_path / "r.json")
    assert all(t["ok"] for t in trials.values()), {k: (t["verdict"], t["reasons"]) for k, t in trials.items()}
    for sid, trial in trials.items():
        kinds = [(e["kind"], e["session_id"]) for e in trial["transcript"]]
        assert kinds[0][0] == "call" and kinds[1][0] == "resume" and kinds[0][1] != kinds[1][1], (sid, kinds)
        assert trial["prompts"]["total"] == 1, (sid, trial["prompts"])


@needs_rustc
@needs_bwrap
@pytest.mark.timeout(600)
def test_a_worker_lost_after_a_local_failure_is_followed_by_one_that_looks_it_up(planner: Path, tmp_path: Path) -> None:
    """RT25R_CRASH=1: each worker dies once its call was answered; the next one looks the step up
    by its key first. After c01's local_failure that lookup now says `not_found` (before the fix
    `unknown`: the restart could only stop), so the step gets its 3 attempts in all, no more; a
    read whose success was lost is read again under its key (§6)."""
    trials = _trials(("c01-read-issue-dns", "gate-1-healthy-delivery"), f"env RT25R_CRASH=1 {planner}",
                     tmp_path / "r.json")
    assert all(t["ok"] for t in trials.values()), {k: (t["verdict"], t["reasons"]) for k, t in trials.items()}
    seen = _calls_and_lookups(trials["c01-read-issue-dns"])
    assert [k for k, _, _ in seen].count("call") == 3, seen
    assert seen[1] == ("lookup", "local_failure", "not_found"), seen
