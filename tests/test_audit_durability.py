"""Durability as decided in issue #19: the intent is the only sync on a call's path.

Writer level: an answer's record is written when `append_answer` returns and
synced by the next durable append or the flush timer; ``strict`` syncs it
first. Daemon level (real processes): a SIGKILL right after an answer never
loses its result record; a daemon killed with records after its last signed
head restarts on its own log and re-anchors them; records appended by someone
else after the last head are reported by verify and refused by the writer,
by the same rule.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from audit_daemon_helpers import agent_call, answered, daemon_args, events, read_lines, setup_remote
from audit_fixtures import FakeClock, FlakyIO, LogFiles, make_log
from helpers import PY, Sandbox, stop_process, wait_for
from vault.audit import decrypt_events, verify
from vault.audit import records as R
from vault.errors import AuditError


class TimedIO(FlakyIO):
    """FlakyIO that notes when each fdatasync ran (monotonic) and can announce it."""

    def __init__(self) -> None:
        super().__init__()
        self.synced_at: list[float] = []
        self.synced = threading.Event()

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        self.synced_at.append(time.monotonic())
        self.synced.set()


def fresh(tmp_path: Path) -> LogFiles:
    return LogFiles(tmp_path / "audit.log", os.urandom(32), Ed25519PrivateKey.generate())


class TestAnswerRecords:
    async def test_written_before_return_synced_by_the_flush_timer(self, tmp_path: Path) -> None:
        """Default durability: on return the record is in the file and no fdatasync ran for
        it; the flush timer syncs it shortly after (5 ms asked; a generous 1 s asserted)."""
        files, io = fresh(tmp_path), TimedIO()
        w = files.writer(io=io)
        await w.append({"type": "intent"})  # durable: one sync
        io.synced.clear()
        before = io.fdatasyncs
        seq = await w.append_answer({"type": "classification", "category": "success"})
        answered_at = time.monotonic()
        assert before == io.fdatasyncs  # the answer did not wait for a sync
        assert seq == decrypt_events(files.log, files.key)[-1]["seq"]  # ... but it is written
        deadline = time.monotonic() + 10
        while io.fdatasyncs == before and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        assert before + 1 == io.fdatasyncs
        assert io.synced_at[-1] - answered_at < 1.0
        w.close()
        assert verify(files.log).intact

    async def test_the_timer_adds_no_sync_while_the_next_intents_cover_the_answers(self, tmp_path: Path) -> None:
        """Calls closer together than flush_after_s: each answer is made durable by the next
        intent's sync, so the flush timer finds no written record that old and adds no
        fdatasync (it did, one per flush_after_s, from the flush thread: the next intent
        waited behind it). Once the calls stop, it still syncs the last answer."""
        files, io = fresh(tmp_path), TimedIO()
        # a sync slower than the inline limit sends later ones to the thread for a while (the
        # writer's documented backoff), which a loaded host can trigger: not this test's subject
        w = files.writer(io=io, flush_after_s=0.5, inline_limit_s=10.0)
        intents, start = 0, time.monotonic()
        while time.monotonic() - start < 1.2:  # the timer's period passes twice
            await w.append({"type": "intent"})
            intents += 1
            await w.append_answer({"type": "classification"})
            await asyncio.sleep(0.005)  # the calls' spacing (an agent's think time), not a wait
        assert intents == io.fdatasyncs
        assert io.synced_in_loop_thread() == [True] * intents  # no intent waited on a thread's sync
        answered_at = time.monotonic()
        deadline = answered_at + 10
        while io.fdatasyncs == intents and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        assert intents + 1 == io.fdatasyncs
        assert io.synced_at[-1] - answered_at < 2.0  # 0.5 s asked; generous for a busy host
        w.close()
        assert verify(files.log).intact

    async def test_written_from_a_thread_when_the_loop_must_not_touch_the_disk(self, tmp_path: Path) -> None:
        """With inline flushes off (a slow disk), the answer is written from a thread, still
        before append_answer returns, still without waiting for a sync."""
        files, io = fresh(tmp_path), FlakyIO()
        w = files.writer(io=io, inline_limit_s=0, flush_after_s=1.0)
        await w.append({"type": "intent"})
        seq = await w.append_answer({"type": "classification"})
        assert (1, seq) == (io.fdatasyncs, decrypt_events(files.log, files.key)[-1]["seq"])
        w.close()

    async def test_the_next_intent_sync_covers_a_written_answer(self, tmp_path: Path) -> None:
        """An answer then the next call's durable intent: one fdatasync makes both durable."""
        files, io = fresh(tmp_path), FlakyIO()
        w = files.writer(io=io, flush_after_s=1.0)  # the timer stays out of the way here
        await w.append_answer({"type": "classification"})
        assert 0 == io.fdatasyncs
        await w.append({"type": "intent"})
        assert 1 == io.fdatasyncs
        head = w.signed_head()
        assert head is not None and head["seq"] == 0  # the first record's head, durable now
        w.close()
        assert [e["type"] for e in decrypt_events(files.log, files.key)] == ["classification", "intent"]

    async def test_strict_syncs_the_answer_before_return(self, tmp_path: Path) -> None:
        """--durability strict: append_answer returns only after its own fdatasync."""
        files, io = fresh(tmp_path), FlakyIO()
        w = files.writer(io=io, durability="strict")
        for i in range(3):
            await w.append_answer({"type": "classification", "i": i})
            assert i + 1 == io.fdatasyncs
        w.close()

    async def test_a_failed_answer_write_raises_and_fails_the_writer(self, tmp_path: Path) -> None:
        """The write itself failing (ENOSPC) is the caller's to hear: AuditError, writer failed."""
        files = fresh(tmp_path)
        io = FlakyIO()
        w = files.writer(io=io)
        await w.append({"type": "intent"})
        io.fail_write = 28
        with pytest.raises(AuditError, match="write"):
            await w.append_answer({"type": "classification"})
        assert w.failed
        w.close()

    async def test_a_failed_timer_sync_fails_the_writer(self, tmp_path: Path) -> None:
        """The timer's fdatasync failing is not retried: the next append is refused."""
        files, io = fresh(tmp_path), FlakyIO()
        w = files.writer(io=io)
        await w.append({"type": "intent"})
        io.fail_fdatasync = 5
        await w.append_answer({"type": "classification"})
        deadline = time.monotonic() + 10
        while not w.failed and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        assert w.failed and "fdatasync" in (w.failure_reason or "")
        with pytest.raises(AuditError):
            await w.append({"type": "intent"})
        w.close()


def forge_record(lines: list[bytes], key: bytes, event: dict) -> bytes:
    """A record that chains onto the last one and hashes right, encrypted with `key`."""
    last = R.parse_record([ln for ln in lines if ln.startswith(R.RECORD_START)][-1])
    seq, time_b = last.seq + 1, R.time_text(last.time + 1)
    nonce = os.urandom(R.NONCE_BYTES)
    ct = AESGCM(key).encrypt(nonce, json.dumps(event).encode(), R.aad(b"%d" % seq, time_b, last.hash))
    line, _ = R.record_line(seq, time_b, last.hash, nonce, ct)
    return line[:-1]


class TestUnanchoredTail:
    def test_records_by_someone_else_are_unanchored_and_refused(self, tmp_path: Path) -> None:
        """A well-chained record appended after the last head without the key: verify says
        unanchored (never intact), and the writer, by the same rule, refuses the log."""
        files = make_log(tmp_path, 4)
        lines = files.lines()
        files.write_lines(lines + [forge_record(lines, os.urandom(32), {"type": "intent"})])
        report = verify(files.log)
        assert ("unanchored", 1, 4) == (report.status, report.unanchored, report.first_bad_seq)
        with pytest.raises(AuditError, match="does not decrypt record 4.*no signed head covers"):
            files.writer()

    def test_records_the_writer_left_unsigned_are_re_anchored(self, tmp_path: Path) -> None:
        """Records with the key after the last head (a writer killed before signing them):
        the next writer checks them, records log_recovered and signs; verify is intact."""
        files = make_log(tmp_path, 3, head_every_records=100)
        lines = files.lines()
        tail = [forge_record(lines, files.key, {"type": "classification", "n": 3})]
        files.write_lines(lines + tail)
        assert "unanchored" == verify(files.log).status
        with files.writer(clock=FakeClock(2e9)) as w:  # log_recovered is seq 4, signed at once
            head = w.signed_head()
        last = R.parse_record([ln for ln in files.lines() if ln.startswith(R.RECORD_START)][-1])
        assert {"seq": 4, "hash": last.hash.decode()} == head
        report = verify(files.log)
        assert report.intact, report
        recovered = decrypt_events(files.log, files.key)[-1]
        assert ("log_recovered", 1, 0) == (recovered["type"], recovered["unanchored_records"],
                                           recovered["torn_bytes"])

    def test_a_record_that_does_not_chain_is_tampered_not_unanchored(self, tmp_path: Path) -> None:
        """The unanchored class is for well-chained records only: a wrong prev is tampered."""
        files = make_log(tmp_path, 4)
        lines = files.lines()
        rec = R.RECORD_RE.fullmatch(forge_record(lines, files.key, {"type": "x"}))
        assert rec is not None
        body = b'{"seq":%s,"time":%s,"prev":"%s","nonce":"%s","ct":"%s"' % (
            rec.group(1), rec.group(2), b"f" * 64, rec.group(4), rec.group(5))
        files.write_lines(lines + [body + R.HASH_SEP + hashlib.sha256(body).hexdigest().encode() + b'"}'])
        assert ("tampered", 4) == (verify(files.log).status, verify(files.log).first_bad_seq)


# ---- with a real daemon ---------------------------------------------------------------

CALLING_AGENT = r"""
import json, os, sys
from vault.client import AgentClient
c = AgentClient(sys.argv[1], timeout=60)
c.open_session("stub", "durability-run")
while True:
    try:
        r = c.call("read_issue", {"issue_id": "ISS-1"})
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__}), flush=True)
        break
    print(json.dumps({"cid": r.correlation_id, "category": str(r.category)}), flush=True)
"""


def calling_agent(sandbox: Sandbox, out: Path):
    with open(out, "w") as f:
        return sandbox.spawn([PY, "-c", CALLING_AGENT, str(sandbox.agent_sock)], stdout=f, stderr=f)


class TestWithADaemon:
    def test_sigkill_right_after_an_answer_keeps_its_result_record(self, sandbox: Sandbox) -> None:
        """The agent reads its answer; the daemon is SIGKILLed at once: the result record the
        answer told of is in the log (it was written before the answer was sent)."""
        url = setup_remote(sandbox)
        daemon = sandbox.start_daemon(*daemon_args(sandbox, url))
        code = ("import json, os, signal, sys\n"
                "from vault.client import AgentClient\n"
                "c = AgentClient(sys.argv[1], timeout=60)\n"
                "c.open_session('stub', 'r')\n"
                "r = c.call('create_issue', {'title': 'kill me'})\n"
                "os.kill(int(sys.argv[2]), signal.SIGKILL)\n"
                "print(json.dumps({'cid': r.correlation_id, 'category': str(r.category)}))\n")
        proc = sandbox.spawn([PY, "-c", code, str(sandbox.agent_sock), str(daemon.pid)],
                             stdout=subprocess.PIPE)
        out, _ = proc.communicate(timeout=60)
        told = json.loads(out)
        assert daemon.wait(timeout=30) == -signal.SIGKILL
        recorded = [ev for ev in events(sandbox) if ev.get("correlation_id") == told["cid"]]
        assert [ev["type"] for ev in recorded][-1] == "classification"
        assert recorded[-1]["category"] == told["category"] == "success"

    def test_records_of_a_direct_call_and_of_an_approved_resumed_call(self, sandbox: Sandbox) -> None:
        """A call answered in its own task: call_requested, intent, classification (carrying
        remote_touched): three records. An approved call collected with call.resume: its
        executor's result is recorded on its own (remote_result) before the resumed answer."""
        _, url = sandbox.start_remote({"tracker_token": "t"})
        sandbox.set_secret("tracker_token", "t")
        sandbox.start_daemon("--remote", url)  # default policy: create_issue asks once per session
        # the approver thinks for 2 s, so the zero-wait call is answered before anyone decides
        sandbox.start_approver([{"match": {"operation": "create_issue"}, "decide": "allow_once", "delay_s": 2}])
        read, pending, done = agent_call(sandbox, (
            "out(client.call('read_issue', {'issue_id': 'ISS-1'}))\n"
            "r = client.call('create_issue', {'title': 't'}, wait_s=0)\n"
            "out(r)\n"
            "out(client.resume(r.resume_token, wait_s=30) if r.resume_token else r)\n"))
        assert (read["category"], done["category"]) == ("success", "success")
        evs = events(sandbox)
        direct = [ev for ev in evs if ev.get("correlation_id") == read["correlation_id"]]
        assert ["call_requested", "intent", "classification"] == [ev["type"] for ev in direct]
        assert direct[-1]["remote_touched"] is True
        assert pending["category"] == "approval_pending"  # a zero wait never waits for the approver
        approved = [ev for ev in evs if ev.get("correlation_id") == pending["correlation_id"]]
        assert [ev["type"] for ev in approved][-3:] == ["intent", "remote_result", "classification"]
        assert approved[-1]["resumed"] is True and "remote_touched" not in approved[-1]
        assert "approval_pending" in [ev.get("category") for ev in approved]
        # `audit show` names the category of each call, whichever record carries it
        shown = sandbox.vaultsim("audit", "show")
        for cid in (read["correlation_id"], pending["correlation_id"]):
            lines = [ln for ln in shown.stdout.splitlines() if f"correlation_id={cid}" in ln]
            assert any(" remote_result " in ln and "category=success" in ln for ln in lines) \
                or any(" classification " in ln and "category=success" in ln for ln in lines), lines
        assert re.search(r" remote_result correlation_id=\S+ category=success remote_touched=true", shown.stdout), shown.stdout

    def test_a_resumes_and_a_lookups_request_time_is_recorded(self, sandbox: Sandbox) -> None:
        """A resume or lookup has no request record; its answer's record says when it was asked
        (`asked`), so the runner grades an agent's deadline by when it sent, not by how long the
        approver and the remote took to answer it."""
        _, url = sandbox.start_remote({"tracker_token": "t"})
        sandbox.set_secret("tracker_token", "t")
        sandbox.start_daemon("--remote", url)
        sandbox.start_approver([{"match": {"operation": "create_issue"}, "decide": "allow_once", "delay_s": 1}])
        pending, done, looked = agent_call(sandbox, (
            "r = client.call('create_issue', {'title': 't'}, wait_s=0)\n"
            "out(r)\n"
            "d = client.resume(r.resume_token, wait_s=30)\n"
            "out(d)\n"
            "out(client.lookup(correlation_id=d.correlation_id))\n"))
        assert (pending["category"], done["category"]) == ("approval_pending", "success")
        evs = events(sandbox)
        told = [ev for ev in evs if ev["type"] == "classification"]
        first, resumed, lookup = told
        assert "asked" not in first  # a call's request time is its call_requested record's
        assert resumed["resumed"] is True and first["time"] <= resumed["asked"] <= resumed["time"]
        reconciled = next(ev for ev in evs if ev["type"] == "reconciliation")
        assert lookup["correlation_id"] == looked["correlation_id"] == reconciled["correlation_id"]
        assert resumed["time"] <= lookup["asked"] <= reconciled["time"] <= lookup["time"]

    def test_a_killed_daemon_restarts_and_re_anchors_its_log(self, sandbox: Sandbox) -> None:
        """SIGKILL under load leaves records after the last signed head (verify: unanchored).
        The restarted daemon checks them with the key, records log_recovered for exactly
        that many, signs, and serves; after a clean stop the log is intact."""
        url = setup_remote(sandbox)
        args = daemon_args(sandbox, url)
        daemon = sandbox.start_daemon(*args)
        out = sandbox.root / "agent.jsonl"
        agent = calling_agent(sandbox, out)
        wait_for(lambda: len(answered(read_lines(out))) >= 20, what="20 answered calls")
        stop_process(daemon, signal.SIGKILL)
        agent.wait(timeout=30)
        log = sandbox.home / "audit.log"
        killed = verify(log)
        # records after the last head line, counted in the file (a kill inside write(2) may also
        # leave a torn line: then verify says truncated, and the restart cuts it away)
        complete = log.read_bytes().split(b"\n")[:-1]
        last_head = max(i for i, line in enumerate(complete) if line.startswith(R.HEAD_START))
        unsigned = sum(1 for line in complete[last_head + 1:] if line.startswith(R.RECORD_START))
        assert unsigned > 0
        if killed.status != "truncated":
            assert ("unanchored", unsigned) == (killed.status, killed.unanchored), killed
        daemon = sandbox.start_daemon(*args)
        revived = verify(log)
        assert revived.status in ("intact", "unanchored")
        assert revived.last_signed_seq is not None and revived.last_signed_seq >= killed.records
        recovered = [ev for ev in events(sandbox) if ev["type"] == "log_recovered"]
        assert [ev["unanchored_records"] for ev in recovered] == [unsigned]
        assert recovered[0]["seq"] == killed.records  # right after the last record before the kill
        stop_process(daemon)
        assert verify(sandbox.home / "audit.log").intact

    def test_a_small_segment_size_rotates_a_real_daemons_log(self, sandbox: Sandbox) -> None:
        """audit.segment_mib and keep_segments in the daemon config: the log rotates under load,
        old segments go, and the set verifies and shows after a stop."""
        url = setup_remote(sandbox)
        config = sandbox.write("daemon.yaml", "audit: {segment_mib: 0.01, keep_segments: 2}\n")
        daemon = sandbox.start_daemon(*daemon_args(sandbox, url, "--config", str(config)))
        out = sandbox.root / "agent.jsonl"
        agent = calling_agent(sandbox, out)
        home = sandbox.home
        wait_for(lambda: len(list(home.glob("audit.*.log"))) >= 2 and
                 min(int(p.name.split(".")[1]) for p in home.glob("audit.*.log")) > 0,
                 what="rotation and retention")
        stop_process(daemon)
        agent.wait(timeout=30)
        assert len(list(home.glob("audit.*.log"))) == 2
        report = verify(home / "audit.log")
        assert (report.status, report.segments) == ("intact", 3), report
        assert report.first_seq > 0
        shown = sandbox.vaultsim("audit", "show", "--json")
        assert shown.returncode == 0, shown.stderr
        seqs = [ev["seq"] for ev in json.loads(shown.stdout)["events"]]
        assert seqs == list(range(report.first_seq, report.first_seq + report.records))
        status = sandbox.vaultsim("status", "--json")
        total = sum(p.stat().st_size for p in home.glob("audit*.log"))
        assert json.loads(status.stdout)["audit_log_bytes"] == total

    def test_bad_audit_options_are_bad_input(self, sandbox: Sandbox) -> None:
        """A retention of zero segments or an unknown durability is refused (exit 2), not run."""
        sandbox.home.mkdir(mode=0o700, exist_ok=True)
        bad = sandbox.vaultsim("daemon", "--foreground", "--audit-keep-segments", "0")
        assert bad.returncode == 2 and "keep_segments" in bad.stderr, bad.stderr
        worse = sandbox.vaultsim("daemon", "--foreground", "--durability", "sometimes")
        assert worse.returncode == 2 and "durability" in worse.stderr
        # one line naming the option and its bound (it was pydantic's multi-line dump with a URL)
        small = sandbox.vaultsim("daemon", "--foreground", "--audit-segment-mib", "0.001")
        assert small.returncode == 2, small.stderr
        assert ["vaultsim daemon: bad audit option: field segment_mib: Input should be greater than or equal "
                "to 0.01"] == small.stderr.strip().splitlines()
