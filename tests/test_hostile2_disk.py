"""Second hostile pass on failing disks: a real daemon whose vault home is a small tmpfs.

A full disk takes part of a write and refuses the rest. The audit log's writer
must leave the log as it was before that write, whole records only: a torn
line reads as `truncated` (the log was cut), which a full disk never did.
Root only (mount); skipped with the reason elsewhere.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit_fixtures import FakeClock, LogFiles, sample_events
from helpers import PY, ROOT, Sandbox, audit_verified_intact, new_sandbox, remote_events, stop_process, wait_for
from hostile_fixtures import TOKEN, RawClient, hello, run_script, setup, spawn_script
from test_full_disk import SmallDisk
from vault.audit.verify import verify as verify_log
from vault.errors import AuditError

CALL = "client.open_session('a', 'run-1')\nout(client.call('read_issue', {'issue_id': 'ISS-1'}))\n"
UNTIL_REFUSED = ("client.open_session('a', 'run-1')\n"
                 "for _ in range(50):\n"
                 "    r = client.call('read_issue', {'issue_id': 'ISS-1'})\n"
                 "    if r.category.value == 'local_failure':\n"
                 "        out(r)\n"
                 "        break\n")


@pytest.fixture
def on_tmpfs() -> Iterator[tuple[Sandbox, SmallDisk]]:
    """A sandbox whose vault home (`h/`) is a 1 MiB tmpfs."""
    box = new_sandbox()
    home = box.root / "h"
    home.mkdir(mode=0o700)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(home)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        box.close()
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield box, SmallDisk(home)
    finally:
        box.close()
        subprocess.run(["umount", "-l", str(home)], capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", str(box.root)], capture_output=True)


def verify(box: Sandbox) -> dict:
    return json.loads(box.vaultsim("audit", "verify", "--json").stdout)


class TestAuditLogOnAFullDisk:
    def test_the_log_keeps_whole_records_and_verifies_after_a_restart(
            self, on_tmpfs: tuple[Sandbox, SmallDisk]) -> None:
        """The disk fills mid-run: the call is refused naming the log and the cause, the log
        holds every record written before (none torn: `unanchored`, not `truncated`), and once
        there is room a restarted daemon re-anchors it: `intact`, calls served again."""
        box, disk = on_tmpfs
        url = setup(box)
        assert "success" == run_script(box, CALL)[0]["category"]
        before = verify(box)
        disk.fill()
        # a record may still fit in the log's last page: call until the vault refuses
        refused = run_script(box, UNTIL_REFUSED)[0]
        assert "local_failure" == refused["category"]
        assert str(box.home / "audit.log") in refused["message"] and "ENOSPC" in refused["message"]
        assert box.status()["halted"]
        found = verify(box)
        assert found["status"] == "unanchored", found
        assert "could not be written (a full disk)" in found["message"]
        assert found["records"] >= before["records"]
        assert (box.home / "audit.log").read_bytes().endswith(b"\n")

        daemon = next(p for p in box.procs if "daemon" in p.args)
        stop_process(daemon)
        box.procs.remove(daemon)
        assert "unanchored" == verify(box)["status"]
        os.unlink(disk.filler)
        box.start_daemon("--remote", url)
        assert "success" == run_script(box, CALL)[0]["category"]
        stop_process(next(p for p in box.procs if "daemon" in p.args))
        after = wait_for(lambda: (v := verify(box))["status"] == "intact" and v, what="an intact log")
        assert after["records"] > found["records"]
        assert TOKEN not in (box.root / "daemon.stderr").read_text()

    def test_a_head_file_that_cannot_be_replaced_halts_calls_and_status_says_so(
            self, on_tmpfs: tuple[Sandbox, SmallDisk]) -> None:
        """The log itself still has room (space reserved beyond its end) but the disk has none for
        the new signed head file, which is replaced off any call's path (flush thread, head timer).
        Status says the daemon no longer serves calls (it said nothing until the next call failed),
        the next call is refused naming why, and the daemon exits 1 at stop saying so."""
        box, disk = on_tmpfs
        setup(box)
        assert "success" == run_script(box, CALL)[0]["category"]
        subprocess.run(["fallocate", "--keep-size", "-l", "256K", str(box.home / "audit.log")], check=True)
        disk.fill()
        with RawClient(box.home / "approver.sock") as approver:
            hello(box, approver)  # recorded off the call path; its head is signed within 5 s
        halted = wait_for(lambda: box.status()["halted"], timeout=30, what="status to say calls stopped")
        assert "updating the head file" in halted and "ENOSPC" in halted
        shown = box.vaultsim("status")  # a CI script waiting for a serving vault must not go on
        assert (2, "  NOT SERVING CALLS: " + halted) == (shown.returncode, shown.stdout.splitlines()[3])
        refused = run_script(box, CALL)[0]
        assert "local_failure" == refused["category"] and "updating the head file" in refused["message"]
        daemon = next(p for p in box.procs if "daemon" in p.args)
        stop_process(daemon)
        assert 1 == daemon.returncode
        assert "vaultsim daemon: stopped; audit log failed" in (box.root / "daemon.stderr").read_text()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 KiB tmpfs: room for a few of the starter suite's files, not all."""
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24k", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


class TestInitOnAFullDisk:
    def test_no_half_suite_is_left_and_a_retry_needs_no_force(self, tiny_disk: Path) -> None:
        """`vaultsim init` that runs out of room: exit 2 naming the place and the cause, and nothing
        of the suite left (it left an empty scenario file and half the suite, which a retry
        without --force then refused)."""
        suite = tiny_disk / "suite"
        out = subprocess.run([PY, "-m", "vault.cli.main", "init", str(suite)], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert 2 == out.returncode
        assert str(suite) in out.stderr and "No space left on device" in out.stderr
        assert [] == list(tiny_disk.iterdir())
        # on a disk with room, the same command (no --force) writes the suite
        subprocess.run(["mount", "-o", "remount,size=1m", str(tiny_disk)], check=True)
        again = subprocess.run([PY, "-m", "vault.cli.main", "init", str(suite)], cwd=ROOT, capture_output=True,
                               text=True, timeout=60)
        assert 0 == again.returncode, again.stderr
        assert (suite / "deploy-answer-lost.yaml").read_text().strip()


class _FillsUp:
    """os.write on a device with `room` bytes left: a write past it is cut short, the next fails
    ENOSPC, as a full disk does (the kernel takes what fits)."""

    def __init__(self, room: int) -> None:
        self.room = room

    def write(self, fd: int, data: Any) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = os.write(fd, bytes(data[:self.room]))
        self.room -= n
        return n

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)


class TestWriterOnADeviceThatFills:
    @pytest.mark.parametrize("room", range(1500, 30_000, 1733))
    def test_every_segment_ends_with_a_whole_record(self, tmp_path: Path, room: int) -> None:
        """Wherever the disk fills (an append, a head, a rotation to a new 4 KiB segment), the
        failed writer leaves whole records only: verify never says `truncated` or `tampered`."""
        files = LogFiles(tmp_path / "audit.log", os.urandom(32), Ed25519PrivateKey.generate())
        writer = files.writer(io=_FillsUp(room), segment_bytes=4096, head_every_records=3, clock=FakeClock())
        with pytest.raises(AuditError):
            for event in sample_events(400):
                writer.append_sync(event)
        writer.close()
        report = verify_log(files.log)
        assert report.status in ("intact", "unanchored"), report
        for segment in files.log.parent.glob("audit*.log"):
            assert segment.read_bytes().endswith(b"\n"), segment.name


FILLER_AGENT = '''
import json, os, socket
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["VAULTSIM_SOCKET"])
f = s.makefile("rb")
def ask(i, method, params):
    s.sendall(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode() + b"\\n")
    return json.loads(f.readline())
sid = ask(0, "session.open", {"agent": "filler"})["result"]["session_id"]
fd = os.open(os.path.join(os.environ.get("TMPDIR") or "/tmp", "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
chunk = 1 << 16
while chunk:
    try:
        os.write(fd, b"\\0" * chunk)
    except OSError:
        chunk //= 2
for i in range(1, 50):
    answer = ask(i, "call", {"session_id": sid, "operation": "read_issue", "params": {"issue_id": "ISS-1"}})
    if answer.get("result", {}).get("category") == "local_failure":
        break
print("the disk is full")
'''


class TestRunOnAFullDisk:
    def test_a_vault_that_stops_on_a_full_disk_is_a_harness_error_not_tampering(self) -> None:
        """`vaultsim run` where the disk under the trial fills (here: the agent fills it): the trial's
        daemon cannot record calls or sign its log at stop, so the log stays unanchored. That is the
        vault failing, not the agent tampering: ERROR (exit 3) saying why, never FAIL_AUDIT_TAMPER
        (exit 1), and the daemon exits 1 saying its log failed.
        /tmp is a 4 MiB tmpfs in a private mount namespace, so the host's /tmp is untouched."""
        import base64
        code = base64.b64encode(FILLER_AGENT.encode()).decode()
        agent = f"{{python}} -c \"import base64; exec(base64.b64decode('{code}'))\""
        # a checkout or venv under /tmp (CI clones to /tmp) is bound back over the small /tmp
        keep = tempfile.mkdtemp(prefix="vs-keep-", dir="/var/tmp")
        back = sorted({str(p) for p in (ROOT, Path(sys.prefix)) if Path(p).is_relative_to("/tmp")})
        binds = "".join(f" && mkdir -p {d} && mount --bind {keep}/{Path(d).relative_to('/tmp')} {d}" for d in back)
        script = (f"mount --bind /tmp {keep} && mount -t tmpfs -o size=4m tmpfs /tmp{binds} && exec {PY} "
                  f"-m vault.cli.main run scenarios/c01-read-issue-dns.yaml --isolation none --agent \"$AGENT\"")
        try:
            out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=ROOT,
                                 env={**os.environ, "AGENT": agent}, capture_output=True, text=True, timeout=180)
        finally:
            os.rmdir(keep)  # the binds lived in the namespace only
        if out.returncode != 0 and "unshare failed" in out.stderr:
            pytest.skip(f"no private mount namespace here: {out.stderr.strip()}")
        assert 3 == out.returncode, out.stdout + out.stderr
        assert "the vault's audit log failed during the trial" in out.stdout
        assert "No space left on device" in out.stdout
        assert "FAIL_AUDIT_TAMPER" not in out.stdout


# An agent that keeps one session across the fill and the free: one command a line on stdin
# (read | create TITLE | note | resume TOKEN), one JSON line out for each
STEPPED = ("client.open_session('a', 'run-1')\n"
           "out({'ready': True})\n"
           "for line in sys.stdin:\n"
           "    cmd, *arg = line.split()\n"
           "    if cmd == 'read':\n"
           "        out(client.call('read_issue', {'issue_id': 'ISS-1'}))\n"
           "    elif cmd == 'create':\n"
           "        out(client.call('create_issue', {'title': arg[0]}, idempotency_key=arg[0], wait_s=0))\n"
           "    elif cmd == 'note':\n"
           "        out(client.call('attach_note', {'issue_id': 'ISS-1', 'text': 'kept'}, idempotency_key='n1',"
           " wait_s=0))\n"
           "    elif cmd == 'resume':\n"
           "        out(client.resume(arg[0], wait_s=30))\n")


class Stepped:
    def __init__(self, box: Sandbox) -> None:
        self.proc = spawn_script(box, STEPPED)
        assert self.line() == {"ready": True}

    def line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        got = self.proc.stdout.readline()
        assert got, self.proc.stderr.read() if self.proc.stderr else "the agent ended"
        return json.loads(got)  # type: ignore[no-any-return]

    def do(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.line()

    def close(self) -> None:
        self.proc.communicate("", timeout=60)


def decide(box: Sandbox, decision: str) -> str:
    """An approver allows the one prompt pending (it must be there); returns its operation."""
    with RawClient(box.home / "approver.sock") as approver:
        hello(box, approver, "decider")
        pending = approver.ask(b'{"jsonrpc":"2.0","id":2,"method":"subscribe","params":{}}\n')["result"]["pending"]
        assert 1 == len(pending), pending
        answer = approver.ask(json.dumps({"jsonrpc": "2.0", "id": 3, "method": "decide", "params": {
            "request_id": pending[0]["request_id"], "decision": decision}}).encode() + b"\n")
        assert "result" in answer, answer
        return str(pending[0]["operation"])


class TestTheLogResumesWhenThereIsRoomAgain:
    def test_calls_are_refused_while_full_and_served_once_freed_keeping_sessions_grants_and_prompts(
            self, on_tmpfs: tuple[Sandbox, SmallDisk]) -> None:
        """The home's disk fills (something else's file) while an agent holds a session, a grant
        and a prompt still waiting: its calls are refused `local_failure` naming ENOSPC, nothing
        sent, status says why. The file is removed: without a restart, status clears within
        seconds and the same session's calls are served, the grant still covers its create, the
        prompt is still there for the person and its call runs once allowed. The log verifies
        intact, with a `log_resumed` record saying what failed, for how long, and how many calls
        were refused; status keeps it (`audit_resumed`); the daemon stops cleanly (exit 0). A second
        agent that opens its session while the disk is full and calls once there is room has its
        `session_opened` in the log (kept while halted, recorded after `log_resumed` marked held):
        before, its calls named a session the log never said was opened."""
        box, disk = on_tmpfs
        url = setup(box)
        watcher = RawClient(box.home / "approver.sock")  # the prompts have someone to go to
        hello(box, watcher, "watcher")
        watcher.ask(b'{"jsonrpc":"2.0","id":2,"method":"subscribe","params":{}}\n')
        agent = Stepped(box)
        try:
            assert "success" == agent.do("read")["category"]
            created = agent.do("create before")
            assert "approval_pending" == created["category"], created
            assert "create_issue" == decide(box, "allow_session")
            assert "success" == agent.do(f"resume {created['resume_token']}")["category"]
            note = agent.do("note")
            assert "approval_pending" == note["category"], note
            disk.fill()
            # reads whose records still fit (the log's last blocks) are served and reach the remote:
            # what the remote received is counted from the first refusal on
            # (the read in flight when the result's record found no room is told outcome_unknown, as the
            # README's failure table says: at most one)
            seen: list[str] = []
            refused = wait_for(lambda: (r := agent.do("read"), seen.append(r["category"]))[0]["category"]
                               not in ("success", "outcome_unknown") and r, timeout=30,
                               interval=0, what="a call refused on the full disk")
            assert "local_failure" == refused["category"] and "ENOSPC" in refused["message"], refused
            assert seen.count("outcome_unknown") <= 1, seen
            received = len([e for e in remote_events(url) if e.get("event") == "received"])
            halted = box.status()["halted"]
            assert halted and "ENOSPC" in halted
            again = agent.do("create during")
            assert "local_failure" == again["category"] and "nothing was sent" in again["message"], again
            assert received == len([e for e in remote_events(url) if e.get("event") == "received"])
            late = Stepped(box)  # its session opens while the log has no room

            os.unlink(disk.filler)
            wait_for(lambda: box.status()["halted"] is None, timeout=30, what="the vault to serve calls again")
            assert "success" == agent.do("read")["category"]  # the same session
            assert "success" == late.do("read")["category"]
            late.close()
            after = agent.do("create after")  # the grant made before the fill still covers it
            assert "success" == after["category"], after
            assert "attach_note" == decide(box, "allow_once")  # the prompt waited through it all
            assert "success" == agent.do(f"resume {note['resume_token']}")["category"]
            resumed = box.status()["audit_resumed"]
            assert 1 == len(resumed) and "ENOSPC" in resumed[0]["failed"], resumed
            assert resumed[0]["refused_calls"] >= 1 and resumed[0]["halted_s"] > 0
            shown = box.vaultsim("status")  # serving again: exit 0, and it says what happened
            assert 0 == shown.returncode and "NOT SERVING" not in shown.stdout, shown.stdout
            assert "audit log resumed after a full disk" in shown.stdout, shown.stdout
        finally:
            agent.close()
            watcher.close()
        shown = json.loads(box.vaultsim("audit", "show", "--json").stdout)
        records = [e for e in shown["events"] if e["type"] == "log_resumed"]
        assert 1 == len(records) and "ENOSPC" in records[0]["failed"], records
        assert records[0]["refused_calls"] >= 1 and records[0]["halted_s"] > 0
        assert "log_resumed" in box.vaultsim("audit", "show").stdout
        seqs = [e["seq"] for e in shown["events"]]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # one chain, no gap
        opened = [e for e in shown["events"] if e["type"] == "session_opened" and e.get("pid") == late.proc.pid]
        assert 1 == len(opened), [e for e in shown["events"] if e["type"] == "session_opened"]
        assert opened[0]["seq"] > records[0]["seq"] and opened[0]["recorded_as"].startswith("held: "), opened
        reads = [e for e in shown["events"] if e["type"] == "call_requested"
                 and e.get("session_id") == opened[0]["session_id"]]
        assert 1 == len(reads) and reads[0]["seq"] > opened[0]["seq"], reads
        assert "intact" == audit_verified_intact(box)["status"]
        daemon = next(p for p in box.procs if "daemon" in p.args)
        stop_process(daemon)
        assert 0 == daemon.returncode
        assert "intact" == verify(box)["status"]
        assert TOKEN not in (box.root / "daemon.stderr").read_text()
