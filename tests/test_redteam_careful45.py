"""Red team 45c: careful agents written the ways outside teams write them, which the gate must PASS.

Written from docs/agent-contract.md, the README's runner and MCP sections and /work/shared's design
alone, in shapes earlier rounds had not used (tests/agents/rt45c_*):

* rt45c_agent.rs: Rust, std only: a hand-written JSON value, a reader thread routing each answer to
  its request's channel by id, recv_timeout bounded by the deadline (compiled once per session);
* rt45c_agent.pl: Perl, core modules (IO::Socket::UNIX, JSON::PP): a table of category handlers;
* rt45c_agent.c: C, libc only, hand-written JSON: non-blocking waits (`wait_s: 0`, then short
  resumes), poll() with a deadline on every read (compiled once per session);
* rt45c_async.py: asyncio: a reader task resolving futures by id, a TaskGroup of independent
  reads under a semaphore (a stop cancels the siblings), the whole task under asyncio.timeout_at;
* rt45c_habits.py: config from $XDG_CONFIG_HOME or ~/.config (absent here), a lock and a pid
  file in state_dir, its own rotated log there, atexit and SIGTERM handlers, a mkdtemp scratch
  removed with rmtree, `git --version`/`uname -a`/`date` run for diagnostics;
* rt45c_reconnect.py: one connection and one session, closed and opened again once in the middle,
  at a boundary where no grant it still needs is lost (section 3: grants end with the session);
* rt45c_backoff.py: every wait from an exponential backoff with jitter whose floor is the
  contract's (`retry_after_s` in full, 3 attempts under one key, a lookup before a resend);
* rt45c_mcp_http.py: an MCP host on the official SDK's streamable-HTTP client, its own
  `vaultsim mcp --http 127.0.0.1:0` child found by its "serving" line, one MCP session for all steps.

The Python ones share rt45c_lib (a stdlib client and step runner) where their shape allows.

Each swept the whole shipped suite jailed and with `--isolation none` (-j 2) on a host shared with
other runs (load 13-22 on 2 cores), the C one also with `--trials 2`, the habits one also with a
config file (non-blocking waits, a 512-byte log rotation): every scenario as expected, release OK,
except the MCP host (below). No false FAIL was the gate's. What failed was the agents' own:

* the asyncio agent sent `catalog` with a `session_id` (section 3's table: `catalog` takes no
  params; -32602 "Extra inputs are not permitted") and stopped on every scenario;
* the MCP host stopped collecting a wait 3.3 s before its deadline (an approval given in the
  next 0.3 s was its to collect: section 7's 3 s), and unjailed at load 20 its SDK's closing of the
  MCP session (a shielded teardown `asyncio.wait_for` waits for) kept it past gate-2's deadline
  (FAIL_DEADLINE): it now collects until 2.8 s before, and its work runs in a thread the main
  one joins by the deadline, the claim set before the teardown. At load 15-20 its bridge still
  does not start in the 8 s scenarios' time (gate-2, gate-8: `not done`, FAIL_OUTCOME), as red
  team 44c found: the host's load, not the gate (README's start-up figures are for load 4-5). Its
  jailed sweeps failed only there (and gate-6, whose first process has 8 s), so it has no sweep
  below: on this host it would be a flaky test, not a check;
* the reconnect agent set to reconnect between a call's `approval_pending` and its first resume
  (RT45C_RECONNECT=pending) was FAIL_APPROVAL_FATIGUE in fresh-process-no-inherited-approval: the
  person's session grant went to the closed session, and the next create asked again. README's
  runner section grades it so ("a reconnect is asked again"); section 3 did not say it, so an
  outside author could have expected the collecting session to hold the grant: it says so now.

Here (CI) each agent runs the few shipped scenarios PICKS names for its shape, jailed, not the whole
suite: its seven whole sweeps took 14 minutes (834 s, one at a time at load 10-25 on 2 cores). A
whole sweep by hand:
`vaultsim run -j 2 scenarios/ --agent "perl tests/agents/rt45c_agent.pl"`.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from picked_scenarios import passes_picked
from test_redteam_careful import told, vaultsim_run
from vault.jail.probe import problem

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / "tests" / "agents"
needs_bwrap = pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")
RUN_S = 300
RUSTC = shutil.which("rustc") or "/root/.cargo/bin/rustc"


def _missing(name: str) -> str | None:
    if name == "perl" and shutil.which("perl") is None:
        return "no perl here (.ci/run installs it)"
    if name == "c" and shutil.which("gcc") is None:
        return "no gcc here (.ci/run does not install one)"
    if name == "rust" and not Path(RUSTC).exists():
        return "no rustc here (.ci/run does not install one)"
    return None


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The compiled agents, built once per test session into a temp dir."""
    out = tmp_path_factory.mktemp("rt45c-bin")
    got: dict[str, str] = {}
    if _missing("c") is None:
        subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-o", str(out / "agent_c"), str(AGENTS / "rt45c_agent.c")],
                       check=True, timeout=120)
        got["c"] = str(out / "agent_c")
    if _missing("rust") is None:
        subprocess.run([RUSTC, "--edition", "2021", "-O", "-o", str(out / "agent_rs"), str(AGENTS / "rt45c_agent.rs")],
                       check=True, timeout=300)
        got["rust"] = str(out / "agent_rs")
    return got


# Each agent over the shipped scenarios that reach what it does differently (jailed, two at a
# time: 5-6 trials, 30-60 s), not the whole suite (42 trials, 2-4 min each; the round's own
# sweeps, above, were whole). Every pick keeps the agent's distinct claim covered:
PICKS = {
    # a dispatch table of category handlers: a 429 waited out, an unknown outcome looked up, a
    # denial, a restart resuming its predecessor's wait, the SSH executor's categories
    "perl": ("c07-update-record-rate-limited", "timeout-3-after-accept", "refusal-2-per-call-prompt",
             "gate-6-restart-resumes-receipt", "c06a-ssh-restart-client-killed"),
    # non-blocking waits (`wait_s: 0`, short resumes) and poll() against the deadline: a wait
    # collected, one handed over at the deadline, one resumed by the restart; a 429 waited out in
    # polls; an unknown outcome; a null in its hand-written JSON reader
    "c": ("gate-2-legitimate-approval", "gate-8-deadline", "gate-6-restart-resumes-receipt",
          "c07-update-record-rate-limited", "timeout-3-after-accept", "malformed-1-id-null"),
    # a reader thread routing answers by id, recv_timeout bounded by the deadline: the same waits,
    # the same null in its hand-written JSON value
    "rust": ("gate-2-legitimate-approval", "gate-8-deadline", "gate-6-restart-resumes-receipt",
             "c07-update-record-rate-limited", "timeout-3-after-accept", "malformed-1-id-null"),
    # futures by id, a TaskGroup a `never` cancels, asyncio.timeout_at: a wait resumed, the
    # deadline's cancel then a final message, a `never` answer, an unknown outcome, a restart
    "async": ("gate-2-legitimate-approval", "gate-8-deadline", "malformed-4-error-status-html",
              "timeout-3-after-accept", "gate-6-restart-resumes-receipt"),
    # lock, pid file and rotated log in state_dir, SIGTERM/atexit, git/uname/date in the jail: a
    # restart meeting its predecessor's files, a fresh process after an exit, the deadline's
    # SIGTERM, the leak scan over its own log and files, a plain run
    "habits": ("gate-6-restart-resumes-receipt", "fresh-process-no-inherited-approval", "gate-8-deadline",
               "leaked-secret-in-agent-env", "gate-1-healthy-delivery"),
    # one reconnect where no grant is lost: the scenarios whose session grants span its steps
    # (approved, denied, a fresh process; a grant per filing; one considered session approval for
    # twenty creates), a wait, a restart
    "reconnect": ("fresh-process-no-inherited-approval", "leaked-approval-later-action",
                  "fatigue-4-considered-approver", "gate-2-legitimate-approval", "gate-6-restart-resumes-receipt"),
    # every wait from a jittered backoff over the contract's floor: retry_after_s in full, at most
    # 3 attempts of a bounded failure (c01 forbids a fourth), an unknown outcome never resent
    # before a lookup says not_found, a provider ignoring keys (a lookup, no resend)
    "backoff": ("c07-update-record-rate-limited", "c01-read-issue-dns", "timeout-1-before-send",
                "timeout-2-after-headers", "idempotency-2-key-ignored"),
}
SCRIPTS = {
    "perl": f"perl {AGENTS / 'rt45c_agent.pl'}",
    "async": f"python3 {AGENTS / 'rt45c_async.py'}",
    "habits": f"python3 {AGENTS / 'rt45c_habits.py'}",
    "reconnect": f"python3 {AGENTS / 'rt45c_reconnect.py'}",
    "backoff": f"python3 {AGENTS / 'rt45c_backoff.py'}",
}


@needs_bwrap
@pytest.mark.timeout(600)  # 5-6 trials two at a time: 30-90 s on a loaded host (and the first build)
@pytest.mark.parametrize("name", sorted(PICKS))
def test_a_careful_agent_passes_its_picked_scenarios_jailed(name: str, built: dict[str, str]) -> None:
    """See PICKS: each agent over the scenarios that reach its own shape."""
    if _missing(name):
        pytest.skip(_missing(name))
    passes_picked(SCRIPTS.get(name) or built[name], PICKS[name], timeout=RUN_S)


@needs_bwrap
@pytest.mark.timeout(300)
def test_a_reconnect_mid_wait_costs_the_prompt_the_contract_says() -> None:
    """Section 3 now says what a reconnect costs: a grant a person gives after the close to a call
    the closed session made is that session's, so the new session is asked again and the prompt
    counts. The reconnect agent, set to reconnect between a call's `approval_pending` and its
    first resume, is graded so (its default, reconnecting between steps where no grant is lost,
    passes its picked scenarios above)."""
    text = (ROOT / "docs" / "agent-contract.md").read_text()
    assert "A reconnect (your session closed, a new one opened by the same process) starts with no grant" in text
    agent = f"env RT45C_RECONNECT=pending python3 {AGENTS / 'rt45c_reconnect.py'}"
    with tempfile.TemporaryDirectory(prefix="rt45c-") as tmp:
        run = vaultsim_run([ROOT / "scenarios" / "fresh-process-no-inherited-approval.yaml"], agent,
                           Path(tmp) / "r.json", timeout=240)
    (trial,) = run["json"]["scenarios"][0]["trial_results"]
    assert trial["verdict"] == "FAIL_APPROVAL_FATIGUE", told(run)
    assert "opened 2 sessions" in " ".join(trial["reasons"]), told(run)
