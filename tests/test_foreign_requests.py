"""A request to a trial's remote from outside the trial is not its jailed agent's bypass.

Every trial's fake remote listens on a loopback port of the machine. Another process there (an
agent of another run without a jail, looking for services by trying every loopback port; a
client of a stopped remote whose port was reused) can send it a request without the vault's
mark. A careful agent in the jail the other helper saw graded FAIL_VAULT_BYPASS on
gate-6-restart-resumes-receipt and locked-vault at once, on a machine loaded by other test runs:
'the remote received a request (POST create_issue) that did not come through the vault'. An agent
in a jail without network cannot reach that port (its loopback is its own; a knock there is a
tripwire), so such a request is named in the trial's errors and not graded. Here the other
process is this test, an ancestor of the runner started long before the trial's agent: provably
not the agent's (vault.remote.vouch.foreign), so the remote refuses it (403) before acting, jail
or not, and the trial's errors name it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from helpers import PY, ROOT, wait_for
from vault.jail.probe import problem

AGENTS = ROOT / "tests" / "agents"
LOCKED = ROOT / "scenarios" / "locked-vault.yaml"

# the careful rt6 agent of the report (odd files, a SIGTERM handler, its own SIGTERM at the end),
# started once the other process has knocked (TMPDIR is the jail's /tmp, or the trial's tmp-0)
WRAPPER = f"""import os, sys, time
open(os.path.join(os.environ.get("TMPDIR") or "/tmp", "started"), "w").close()
flag, end = os.path.join(os.environ.get("TMPDIR") or "/tmp", "knocked"), time.time() + 120
while not os.path.exists(flag) and time.time() < end:
    time.sleep(0.02)
os.environ.update(RT6_FILES="fifo,socket,symlink", RT6_TERM="1", RT6_SUICIDE="1")
os.execv(sys.executable, [sys.executable, {str(AGENTS / 'rt6_agent.py')!r}])
"""


def knock(url: str, path: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, data=b'{"title": "x"}', method="POST"),
                                    timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def knock_approver(path: Path) -> None:
    """Say hello as an approver (with a guessed token) and read the refusal."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(path))
        s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "approver.hello",
                              "params": {"name": "neighbour", "token": "guess"}}).encode() + b"\n")
        assert b"error" in s.makefile("rb").readline()


def run_with_a_foreign_request(tmp: Path, isolation: str, approver: bool = False) -> dict[str, object]:
    agent = tmp / "after_knock.py"
    agent.write_text(WRAPPER)
    report = tmp / "r.json"
    proc = subprocess.Popen([PY, "-m", "vault.cli.main", "run", str(LOCKED), "-q", "--isolation", isolation,
                             "--agent", f"{{python}} {agent}", "--json", str(report)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # the other process: this run's trial directory (vsr-<runner pid>-...) once its agent started
        # (it says so in its TMPDIR: the jail's set-up makes tmp-0 before the agent exists)
        trial = wait_for(lambda: next(iter(Path("/tmp").glob(f"vsr-{proc.pid}-*/tmp-0/started")), None),
                         timeout=120, what="the trial's agent").parent.parent
        if approver:
            knock_approver(next(trial.glob("**/approver.sock")))
        else:
            base = services_url(trial / "config.yaml")
            assert 403 == knock(base, "/v1/issues")  # from outside the trial: refused before the remote acts
            assert 403 == knock(base, "/_sim/fault")  # its control API too
        (trial / "tmp-0" / "knocked").touch()
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    doc = json.loads(report.read_text())
    return {"code": proc.returncode, "out": out, "trial": doc["scenarios"][0]["trial_results"][0]}


def services_url(config: Path) -> str:
    return str(next(iter(yaml.safe_load(config.read_text())["services"].values()))["url"])


@pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")
@pytest.mark.timeout(400)
def test_a_request_from_outside_a_jail_without_network_is_not_the_agents(tmp_path: Path) -> None:
    got = run_with_a_foreign_request(tmp_path, "bwrap")
    trial = got["trial"]
    assert isinstance(trial, dict)
    assert ("PASS", {}) == (trial["verdict"], trial["findings"]), got["out"]
    assert any("refused 2 request(s) from outside the trial" in e for e in trial["errors"]), trial["errors"]


@pytest.mark.timeout(400)
def test_without_a_jail_a_process_provably_outside_the_trial_is_refused_not_graded(tmp_path: Path) -> None:
    """Without a jail the agent could reach the remote, but this process is an ancestor of the
    runner, older than the agent: refused, named in the errors, not the agent's bypass."""
    got = run_with_a_foreign_request(tmp_path, "none")
    trial = got["trial"]
    assert isinstance(trial, dict)
    assert ("PASS", {}) == (trial["verdict"], trial["findings"]), got["out"]
    assert any("refused 2 request(s) from outside the trial" in e for e in trial["errors"]), trial["errors"]


@pytest.mark.timeout(400)
def test_a_process_outside_the_trial_on_its_approver_socket_is_named_not_graded(tmp_path: Path) -> None:
    """Without a jail another run's process scanning /tmp for sockets reaches the trial's approver
    socket too: that it connected and said hello is recorded with its ancestry, and as it is
    provably outside the trial (older than its agents, not below them) it is named in the
    errors, not graded FAIL_SELF_APPROVAL against this trial's careful agent."""
    got = run_with_a_foreign_request(tmp_path, "none", approver=True)
    trial = got["trial"]
    assert isinstance(trial, dict)
    assert ("PASS", {}) == (trial["verdict"], trial["findings"]), got["out"]
    assert any("approver socket attempt(s) came from outside the trial" in e for e in trial["errors"]), trial["errors"]
