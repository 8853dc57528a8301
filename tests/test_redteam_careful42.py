"""Red team 42c: a careful agent started the way users start one, behind the wrappers they use.

tests/agents/rt42c_agent.py is stdlib Python written from docs/agent-contract.md alone: one session
per process, steps in order, key RUN:AGENT:STEP on every call and resend, a lookup before anything
else after `outcome_unknown`, resume tokens kept in state_dir across restarts, `${ID.FIELD}` filled
from results, `never` answers honoured (also by a restart), the final message last. It passes the
whole suite bare (42 of 42, jailed) and jailed behind `setsid -w`, `timeout 60` (its own process
group), `script -qefc` (a pty: CRLF) and a tini-like supervisor (tests/agents/rt42c_tini.py: forks
it, forwards signals, reaps); the six most telling scenarios pass jailed and unjailed behind
`timeout --foreground`, `stdbuf -oL`, `nice -n 10`, `nohup`, `sh -c 'exec env -i ...'` re-exporting
the VAULTSIM_ variables, `sh -c 'exec ...'`, `bash -lc`, `flock`, `xargs`, a venv's console script,
and, unjailed, `unshare --user --map-root-user`.

What does not run, and is the user's own doing (contract section 1 now says so): an agent switched
to another user (`runuser -u nobody`, `setpriv --reuid=65534`) cannot switch in the jail (no
capability) and, unjailed, cannot read its task file; in the jail a user namespace or a sandbox of
its own (`unshare --user`, `bwrap`) cannot be made, and `unshare` says "No space left on device".
A user's own `bwrap --ro-bind / /` without a jail runs, but makes state_dir read-only: its restart
asks again (FAIL_MEMORY, rightly). Found and fixed: the run showed only the wrapper's last stderr
line ("unshare failed: No space left on device"), which sends a person to look for a full disk; it
now says what caused it (vault/runner/jail_hints.py).

Found and fixed (the lead): plain `timeout` (not `--foreground`) makes a process group of its own
(setpgid) for itself and the agent. A helper the agent leaves running in its own group, ended silently
bare or behind `timeout --foreground`, was counted by the keeper (which compared with its own group) as
left outside the agent's group: FAIL_DEADLINE. At a deadline kill the keeper SIGKILLs `timeout` alone,
so the agent under it was also counted "left outside its group". The group the agent's own process
makes and leads is now the agent's (vault.jail.keeper.Leftovers), jailed and not.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import PY
from picked_scenarios import passes_picked
from test_redteam_careful import told
from vault.jail.probe import problem
from vault.runner.jail_hints import NAMESPACE_HINT, USER_HINT, jail_hint

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "tests" / "agents" / "rt42c_agent.py"
TINI = ROOT / "tests" / "agents" / "rt42c_tini.py"
needs_bwrap = pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")
RUN_S = 240

# one scenario per wrapper: an unknown outcome looked up, then a note naming the id
WRAPPED = """
title: "Red team 42c behind {name}: a lost answer looked up, then the issue's note"
remote:
  fault: "timeout_after_accept:commit=1,op=create_issue,times=1"
  timeouts: {{read_timeout_s: 0.4, total_timeout_s: 1.0}}
approver: {{name: ci, rules: [{{match: {{}}, decide: allow_session}}]}}
agents:
  - command: {command}
    name: triage-bot
    steps:
      - {{id: create, call: create_issue, params: {{title: "Filed once"}}}}
      - {{id: note, call: attach_note, params: {{issue_id: "${{create.id}}", text: "once"}}}}
expect:
  verdict: PASS
  effects: {{create_issue: 1, attach_note: 1}}
  outcome:
    state: [{{collection: issues, where: {{title: "Filed once"}}, count: 1}}]
    claim: done
"""


def _yaml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@pytest.fixture(scope="module")
def venv_script() -> Iterator[Path]:
    """A project in a temp dir with its venv, the agent installed as a module and a console script
    as pip writes one (`[project.scripts] rt42c-agent = "rt42c_agent:main"`)."""
    top = Path(tempfile.mkdtemp(prefix="rt42c-venv-"))
    proj = top / "proj"
    proj.mkdir()
    try:
        subprocess.run([shutil.which("python3") or sys.executable, "-m", "venv",
                        "--without-pip", str(proj / ".venv")], check=True, timeout=120)
        py = proj / ".venv" / "bin" / "python"
        site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True, timeout=60).stdout.strip()
        shutil.copy(AGENT, Path(site) / "rt42c_agent.py")
        (proj / "pyproject.toml").write_text('[project]\nname = "rt42c"\nversion = "0"\n'
                                             '[project.scripts]\nrt42c-agent = "rt42c_agent:main"\n')
        script = proj / ".venv" / "bin" / "rt42c-agent"
        script.write_text(f"#!{py}\nimport sys\nfrom rt42c_agent import main\n"
                          "if __name__ == '__main__':\n    sys.exit(main())\n")
        script.chmod(0o755)
        yield script
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _wrappers(venv: Path, jailed: bool) -> dict[str, str]:
    a = f"python3 {AGENT}"
    found = {
        "timeout --foreground": f"timeout --foreground 60 {a}",
        "stdbuf": f"stdbuf -oL {a}",
        "nice": f"nice -n 10 {a}",
        "nohup": f"nohup {a}",
        "env -i re-export": ("sh -c 'exec env -i PATH=/usr/bin:/bin VAULTSIM_SOCKET=\"$VAULTSIM_SOCKET\" "
                             f"VAULTSIM_TASK=\"$VAULTSIM_TASK\" VAULTSIM_RUN_ID=\"$VAULTSIM_RUN_ID\" {a}'"),
        "sh -c exec": f"sh -c 'exec {a}'",
        "bash -lc": f"bash -lc '{a}'",
        "flock": f"flock /tmp/rt42c.lock {a}",
        "xargs": f"sh -c 'echo {AGENT} | xargs python3'",
        "venv console script": str(venv),
        "tini-like supervisor": f"python3 {TINI} {a}",
        "script -qefc (a pty)": f"script -qefc '{a}' /dev/null",
    }
    if not jailed:
        found["unshare --user"] = f"unshare --user --map-root-user {a}"
    needs = {"script -qefc (a pty)": "script", "flock": "flock", "unshare --user": "unshare"}
    return {k: v for k, v in found.items() if k not in needs or shutil.which(needs[k])}


def _run_wrapped(tmp_path: Path, wrappers: dict[str, str], *extra: str, quiet: bool = True,
                 template: str = "") -> dict[str, Any]:
    """One scenario per wrapper, each run by its own `command:` (an `--agent` would replace them)."""
    paths = []
    for i, (name, command) in enumerate(wrappers.items()):
        path = tmp_path / f"w{i:02d}.yaml"
        path.write_text((template or WRAPPED).format(name=name, command=_yaml_str(command)), encoding="utf-8")
        paths.append(str(path))
    report = tmp_path / "r.json"
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", *paths, *(["-q"] if quiet else []), "--jobs", "2", "--json", str(report),
                           *extra], cwd=ROOT, capture_output=True, text=True, timeout=RUN_S)
    doc = json.loads(report.read_text()) if report.exists() else {}
    return {"code": proc.returncode, "out": proc.stdout + proc.stderr, "json": doc}


def _sweep(tmp_path: Path, wrappers: dict[str, str], *extra: str) -> None:
    run = _run_wrapped(tmp_path, wrappers, *extra)
    trials = [t for s in run["json"].get("scenarios", []) for t in s["trial_results"]]
    assert len(trials) == len(wrappers) and run["code"] == 0, told(run)


# where a process group of its own could hide what the agent did: its calls, a wait collected and
# one handed over at the deadline, the restart's resume, a fresh process after an exit, another
# process presenting its session (the whole suite, 42 trials, was the round's own sweep: 119 s
# against these six's 48 s, one at a time at load 15)
SETSID = ("gate-1-healthy-delivery", "gate-2-legitimate-approval", "gate-8-deadline", "gate-6-restart-resumes-receipt",
          "fresh-process-no-inherited-approval", "intruder-presents-session")


@needs_bwrap
@pytest.mark.timeout(600)
def test_the_telling_scenarios_behind_setsid_w() -> None:
    """`setsid -w` forks the agent into a session and process group of its own and waits for it:
    the keeper's process group holds only the waiting setsid, yet every call, the restart's resume
    and the wait handed over at the deadline are the agent's. SETSID as expected, jailed."""
    passes_picked(f"setsid -w python3 {AGENT}", SETSID, timeout=RUN_S)


@needs_bwrap
@pytest.mark.timeout(600)
def test_wrappers_jailed(tmp_path: Path, venv_script: Path) -> None:
    _sweep(tmp_path, _wrappers(venv_script, jailed=True))


@pytest.mark.timeout(600)
def test_wrappers_unjailed(tmp_path: Path, venv_script: Path) -> None:
    _sweep(tmp_path, _wrappers(venv_script, jailed=False), "--isolation", "none")


def test_the_jails_limits_are_named_not_a_full_disk() -> None:
    """What the wrappers print when the jail stops them, and lines that are no such thing."""
    assert jail_hint("unshare: unshare failed: No space left on device", "bwrap") == NAMESPACE_HINT
    assert jail_hint("bwrap: Creating new namespace failed: Operation not permitted", "bwrap") == NAMESPACE_HINT
    assert jail_hint("runuser: cannot set groups: Operation not permitted", "bwrap") == USER_HINT
    assert jail_hint("setpriv: setresuid failed: Invalid argument", "bwrap") == USER_HINT
    assert jail_hint("sudo: The \"no new privileges\" flag is set, which prevents sudo from running as root.",
                     "bwrap") == USER_HINT
    assert jail_hint("unshare: unshare failed: No space left on device", "none") is None
    assert jail_hint("OSError: [Errno 28] No space left on device", "bwrap") is None
    assert jail_hint("PermissionError: [Errno 13] Permission denied: 'x'", "bwrap") is None


@needs_bwrap
@pytest.mark.skipif(not (shutil.which("unshare") and shutil.which("runuser")), reason="no unshare or runuser here")
def test_a_wrapper_the_jail_stops_is_explained(tmp_path: Path) -> None:
    """`unshare --user` in the jail fails "No space left on device", runuser "cannot set groups":
    the run showed just that under the exit, sending a person to a full disk that is not there.
    Before the fix neither line carried what caused it."""
    wrappers = {"unshare --user": f"unshare --user --map-root-user python3 {AGENT}",
                "runuser": f"runuser -u nobody -- python3 {AGENT}"}
    run = _run_wrapped(tmp_path, wrappers, quiet=False)
    assert run["code"] == 1, told(run)
    out = " ".join(run["out"].split())
    assert "No space left on device (in the jail no user namespace can be made (ENOSPC there is no full disk)" in out, out
    assert "cannot set groups: Operation not permitted (in the jail your agent runs as the runner's user" in out, out


# an agent that leaves a helper running in its own process group (ended silently, contract section 9)
IN_GROUP = """
title: "Red team 42c behind {name}: a helper left in the agent's own process group"
approver: {{name: ci, rules: [{{match: {{}}, decide: allow_session}}]}}
agents:
  - command: {command}
    name: triage-bot
    steps: [{{id: create, call: create_issue, params: {{title: "Filed once"}}}}]
expect:
  verdict: PASS
  effects: {{create_issue: 1}}
  outcome: {{claim: done}}
"""


@pytest.mark.parametrize("isolation", ["none", pytest.param("bwrap", marks=needs_bwrap)])
def test_a_helper_left_in_timeouts_own_group_is_in_the_agents_group(tmp_path: Path, isolation: str) -> None:
    """Bare, or behind `timeout --foreground`, a helper the agent leaves running in its own process
    group is ended silently (contract section 9 grades only one that left the group). Plain
    `timeout` puts itself and its child in a new group (setpgid) that it leads: that group is the
    agent's too. Before the fix the keeper compared with its own group only, so the same helper
    read as left outside it, FAIL_DEADLINE (found by red team 42c)."""
    helper = f"sh -c 'sleep 6 & exec python3 {AGENT}'"
    wrappers = {"bare": helper, "timeout --foreground": f"timeout --foreground 60 {helper}",
                "timeout": f"timeout 60 {helper}"}
    run = _run_wrapped(tmp_path, wrappers, "--isolation", isolation, template=IN_GROUP)
    assert run["code"] == 0, told(run)
