"""Secret holders keep a same-user process out of their memory and environment.

Root can read any process (CAP_SYS_PTRACE), so the daemon, the fake remote and
the scripted approver run here as an unprivileged user (nobody, 65534), and
so does the reader: the same uid, as an agent under `--isolation none` would
be. A plain process of that user is readable the same way, so a refusal means
the secret holder made itself non-dumpable, not that the test cannot read.

Where the interpreter lives in a directory nobody may not enter (a pyenv
under /root), every one of these processes gets CAP_DAC_READ_SEARCH, the
same for all: it lets them reach the interpreter, and it is no help against
a non-dumpable process (that takes CAP_SYS_PTRACE).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, stop_process, wait_for

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv to run processes as another user")

# as the same user: try to read a process's memory (at a mapped address) and environment
READER = """
import json, sys
pid = int(sys.argv[1]); out = {}
try:
    with open(f"/proc/{pid}/maps") as f:
        start = int(f.readline().split("-")[0], 16)
    with open(f"/proc/{pid}/mem", "rb", 0) as mem:
        mem.seek(start); mem.read(16)
    out["mem"] = "read"
except OSError as exc:
    out["mem"] = exc.__class__.__name__
try:
    open(f"/proc/{pid}/environ", "rb").read(); out["environ"] = "read"
except OSError as exc:
    out["environ"] = exc.__class__.__name__
print(json.dumps(out))
"""


def _reach() -> list[str]:
    """setpriv's options that let nobody reach this interpreter (none where it already can)."""
    try:
        ok = subprocess.run([PY, "-c", "pass"], user=NOBODY, group=NOBODY, extra_groups=[],
                            capture_output=True, timeout=60).returncode == 0
    except OSError:
        ok = False
    return [] if ok else ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]


def as_nobody(argv: list[str], **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *REACH,
                             "--", *argv], cwd=ROOT, text=True, start_new_session=True, **kw)


def read_as_nobody(pid: int) -> dict[str, str]:
    proc = as_nobody([PY, "-c", READER, str(pid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return json.loads(out)


REACH = _reach() if os.geteuid() == 0 else []


@pytest.fixture
def nobody_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="vs-nd-", dir="/tmp"))
    os.chown(root, NOBODY, NOBODY)
    os.chmod(root, 0o700)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def env_for(root: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root), "PYTHONUNBUFFERED": "1",
            "VAULTSIM_HOME": str(root / "h"), "VAULTSIM_KEYRING_DIR": str(root / "kr"),
            "PYTHON_KEYRING_BACKEND": "vault.store.keyring_backend.FileKeyring"}


class TestSecretHoldersAreNotDumpable:
    def test_a_plain_process_of_that_user_is_readable(self) -> None:
        """The control: the reader can read an ordinary process of the same user."""
        sleeper = as_nobody([PY, "-c", "import time; time.sleep(60)"])
        try:
            wait_for(lambda: Path(f"/proc/{sleeper.pid}/maps").exists(), what="the sleeper")
            assert {"mem": "read", "environ": "read"} == read_as_nobody(sleeper.pid)
        finally:
            stop_process(sleeper)

    def test_the_daemon(self, nobody_root: Path) -> None:
        """A daemon holding a credential: its memory and environment refuse the same user."""
        env = env_for(nobody_root)
        secret = as_nobody([PY, "-m", "vault.cli.main", "secret", "set", "tracker_token"], env=env,
                           stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = secret.communicate("vsk_" + "z" * 32, timeout=60)
        assert secret.returncode == 0, err
        log = open(nobody_root / "daemon.log", "w")
        daemon = as_nobody([PY, "-m", "vault.cli.main", "daemon", "--foreground", "--unlocked"], env=env,
                           stdout=log, stderr=log)
        log.close()
        try:
            wait_for(lambda: (nobody_root / "h" / "agent.sock").exists() or daemon.poll() is not None,
                     what="the daemon")
            assert daemon.poll() is None, (nobody_root / "daemon.log").read_text()
            assert {"mem": "PermissionError", "environ": "PermissionError"} == read_as_nobody(daemon.pid)
            cmdline = Path(f"/proc/{daemon.pid}/cmdline").read_bytes()
            assert b"vsk_" not in cmdline and b"keyring" not in cmdline
        finally:
            stop_process(daemon)

    def test_the_remote(self, nobody_root: Path) -> None:
        """The fake remote (every token it accepts): the same."""
        creds = nobody_root / "creds.json"
        creds.write_text(json.dumps({"tracker_token": "vsk_" + "y" * 32}))
        os.chmod(creds, 0o600)
        os.chown(creds, NOBODY, NOBODY)
        remote = as_nobody([PY, "-m", "vault.cli.main", "remote", "--credentials", str(creds)],
                           env=env_for(nobody_root), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert remote.stdout is not None
            assert remote.stdout.readline().startswith("listening on ")
            assert {"mem": "PermissionError", "environ": "PermissionError"} == read_as_nobody(remote.pid)
        finally:
            stop_process(remote)

    def test_the_scripted_approver(self, nobody_root: Path) -> None:
        """`vaultsim approve` (it holds the approver token): the same."""
        env = env_for(nobody_root)
        log = open(nobody_root / "daemon.log", "w")
        daemon = as_nobody([PY, "-m", "vault.cli.main", "daemon", "--foreground", "--unlocked"], env=env,
                           stdout=log, stderr=log)
        log.close()
        script = nobody_root / "approver.yaml"
        script.write_text("name: ci\nrules: [{match: {}, decide: allow_once}]\n")
        os.chown(script, NOBODY, NOBODY)
        approver = None
        try:
            wait_for(lambda: (nobody_root / "h" / "approver.sock").exists() or daemon.poll() is not None,
                     what="the daemon")
            approver = as_nobody([PY, "-m", "vault.cli.main", "approve", "--script", str(script)], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and approver.poll() is None:
                if read_as_nobody(approver.pid)["environ"] == "PermissionError":
                    break
            assert approver.poll() is None
            assert {"mem": "PermissionError", "environ": "PermissionError"} == read_as_nobody(approver.pid)
        finally:
            if approver is not None:
                stop_process(approver)
            stop_process(daemon)


class TestProcGuard:
    def test_flag_round_trip_in_a_child(self) -> None:
        """make_undumpable clears the flag; make_dumpable sets it back (in a child, not the test)."""
        code = ("from vault import proc_guard as g; a = g.is_dumpable(); g.make_undumpable(); b = g.is_dumpable();"
                "g.make_dumpable(); print(a, b, g.is_dumpable())")
        out = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=30)
        assert "True False True" == out.stdout.strip(), out.stderr
