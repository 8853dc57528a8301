"""The audit log as the daemon uses it, with real processes (issue #5, "Done when").

A real daemon, a real fake remote and fresh agent processes; the log is read
back with the home's audit key (decrypt) and checked offline (verify). Faults
on the audit path are real: a log that is /dev/full, and an fdatasync that
fails from a point the test chooses (an I/O layer injected into the writer of
a real daemon process, see `audit_daemon_helpers`). Nothing sleeps a fixed time.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from audit_daemon_helpers import (CREATE, READ, agent_call, answered, audit_key, daemon_args, events,
                                  read_lines, setup_remote, spawn_agent, start_failing_daemon)
from helpers import PY, Sandbox, audit_verified_intact, canary, remote_events, remote_ledger, sim_headers, stop_process, wait_for
from vault.audit import AuditWriter, verify
from vault.audit import records as R
from vault.audit.keys import load_or_create_signing_key
from vault.errors import AuditError

CALL_TYPES = ("call_requested", "intent", "classification")


def one_call(op: tuple[str, dict[str, Any]]) -> str:
    return f"out(client.call({op[0]!r}, {op[1]!r}))\n"


def effects(url: str) -> int:
    return sum(e["effects"] for e in remote_ledger(url)["operations"])


def assert_consistent_after_kill(log: Path) -> tuple[str, int]:
    """What a SIGKILL may leave: intact, records after the last signed head (unanchored),
    or a torn last line (truncated), never anything else; returns (status, last seq)."""
    report = verify(log)
    if report.status == "truncated":
        data = log.read_bytes()
        assert not data.endswith(b"\n"), report  # a torn last line, not a cut inside the log
        assert report.first_bad_seq in (report.records - 1, report.records), report
    else:
        assert report.status in ("intact", "unanchored"), report
    return report.status, report.records - 1


# ---- crash safety ------------------------------------------------------------------


def tear_last_write(log: Path, rng: random.Random) -> None:
    """Append what a writer killed inside write(2) leaves: part of the next record's line."""
    last = next(line for line in reversed(log.read_bytes().split(b"\n")) if line.startswith(R.RECORD_START))
    rec = R.parse_record(last)
    assert rec is not None
    line, _ = R.record_line(rec.seq + 1, R.time_text(rec.time + 0.001), rec.hash, os.urandom(R.NONCE_BYTES),
                            os.urandom(200))
    with open(log, "ab") as f:
        f.write(line[: rng.randint(1, len(line) - 2)])


CRASH_AGENT = r"""
import json, os, sys, time
from vault.client import AgentClient
sock, name, stop, ops = sys.argv[1:5]
i = 0
while not os.path.exists(stop):
    try:
        c = AgentClient(sock, timeout=60)
    except Exception:
        time.sleep(0.02)  # no daemon yet (killed, restarting): poll until one listens
        continue
    try:
        c.open_session(name, "crash-run")
        while not os.path.exists(stop):
            if ops[i % len(ops)] == "c":
                r = c.call("create_issue", {"title": f"{name}-{i}"})
            else:
                r = c.call("read_issue", {"issue_id": "ISS-1"})
            i += 1
            print(json.dumps({"cid": r.correlation_id, "category": str(r.category)}), flush=True)
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__}), flush=True)
    finally:
        c.close()
"""

CRASH_ITERATIONS = 25
CRASH_AGENTS = 4


class TestCrashLoop:
    @pytest.mark.timeout(420)  # 25 daemon starts; on a shared, loaded 2-core host each can take seconds
    def test_sigkill_under_load_loses_no_answered_call(self, sandbox: Sandbox) -> None:
        """SIGKILL the daemon 25 times while 4 agents call; restart on the same home each time.

        Right after each kill, every call an agent saw answered has its result
        record in the log, with the category it was told (written before the
        answer; the answer does not wait for its fdatasync), and the log is
        intact, unanchored (records after the last head) or truncated by a torn
        last line only. After each restart the daemon has re-anchored it: every
        record from before the kill is covered by a signed head. Every create
        that reached the remote has its intent in the log; seqs stay contiguous
        across all restarts and the final log is intact.
        """
        url = setup_remote(sandbox)
        args = daemon_args(sandbox, url)
        log = sandbox.home / "audit.log"
        stop = sandbox.root / "stop-agents"
        outs = [sandbox.root / f"crash-agent-{a}.jsonl" for a in range(CRASH_AGENTS)]
        daemon = sandbox.start_daemon(*args)
        agents = []
        for a, out in enumerate(outs):  # creates and reads interleaved across agents
            with open(out, "w") as f:
                agents.append(sandbox.spawn(
                    [PY, "-c", CRASH_AGENT, str(sandbox.agent_sock), f"agent-{a}", str(stop), "rc" if a % 2 else "cr"],
                    stdout=f, stderr=f))

        def total() -> int:
            return sum(len(answered(read_lines(o))) for o in outs)

        rng = random.Random(20240501)
        statuses = Counter[str]()
        want = 0
        for it in range(CRASH_ITERATIONS):
            k = rng.randint(0, 30)  # kill after k more answers: anywhere from start-up to mid-load
            want += k
            goal = total() + k
            wait_for(lambda: total() >= goal, timeout=30, what=f"{k} answered calls (iteration {it})")
            stop_process(daemon, signal.SIGKILL)
            status, last_seq = assert_consistent_after_kill(log)
            statuses[status] += 1
            # every answer given so far has its result record on disk already
            told_now = {line["cid"]: line["category"] for o in outs for line in answered(read_lines(o))}
            recorded = {ev["correlation_id"]: ev["category"] for ev in events(sandbox)
                        if ev["type"] == "classification"}
            assert {cid: recorded.get(cid) for cid in told_now} == told_now, f"iteration {it}"
            if it % 3 == 1 and log.read_bytes().endswith(b"\n"):
                # a kill inside write(2) is rare at these sizes: make every third one tear
                tear_last_write(log, rng)
                assert assert_consistent_after_kill(log)[0] == "truncated"
                statuses["torn by the test"] += 1
            daemon = sandbox.start_daemon(*args)  # recovers a torn tail, re-anchors, continues the chain
            # read while the agents' calls are being written: a line caught mid-write reads as torn
            # for a moment, a tail the restart left torn stays so
            after = wait_for(lambda: (v := verify(log)).status in ("intact", "unanchored") and v, timeout=10,
                             interval=0.05, what=f"the log to verify intact or unanchored after restart {it}")
            assert after.last_signed_seq is not None and after.last_signed_seq > last_seq, (after, last_seq)
        stop.touch()
        for agent in agents:
            agent.wait(timeout=30)
        stop_process(daemon)  # SIGTERM: the last head is signed

        report = verify(log)
        assert report.status == "intact", report
        evs = events(sandbox)
        assert [ev["seq"] for ev in evs] == list(range(len(evs)))
        told = {line["cid"]: line["category"] for o in outs for line in answered(read_lines(o))}
        assert len(told) >= want >= 100, (len(told), want)
        classified = {ev["correlation_id"]: ev["category"] for ev in evs if ev["type"] == "classification"}
        missing = {cid for cid in told if cid not in classified}
        assert not missing, f"{len(missing)} answered calls are not in the log"
        assert {cid: classified[cid] for cid in told} == told
        # no unaudited action: every create that reached the remote had a durable intent first
        intents = {ev["correlation_id"] for ev in evs if ev["type"] == "intent"}
        created = {e["correlation_id"] for e in remote_events(url)
                   if e.get("event") == "received" and e.get("route") == "create_issue"}
        assert created and created <= intents, created - intents
        print(f"crash loop: {len(told)} answered calls, {len(evs)} events, after-kill verify {dict(statuses)}")


# ---- fail closed -------------------------------------------------------------------


def status_text(sandbox: Sandbox) -> str:
    """`vaultsim status` of a daemon that serves no calls: it answers 2, as a locked one does."""
    out = sandbox.vaultsim("status")
    assert out.returncode == 2, out.stderr
    return out.stdout


class TestFailClosed:
    def test_full_device_refuses_every_call_before_the_remote(self, sandbox: Sandbox) -> None:
        """audit.log is /dev/full: the daemon starts but serves no call; nothing reaches the remote."""
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full")
        url = setup_remote(sandbox)
        sandbox.home.mkdir(mode=0o700, exist_ok=True)
        (sandbox.home / "audit.log").symlink_to("/dev/full")
        sandbox.start_daemon(*daemon_args(sandbox, url))
        halted = sandbox.status()["halted"]
        assert halted and "No space left on device" in halted
        results = agent_call(sandbox, one_call(READ) + one_call(CREATE))
        assert [r["category"] for r in results] == ["local_failure", "local_failure"]
        for r in results:
            assert "audit log" in r["message"] and "nothing was sent" in r["message"]
            assert "No space left on device" in r["message"]
        assert remote_events(url) == []
        assert remote_ledger(url)["operations"] == []
        text = status_text(sandbox)
        assert "NOT SERVING CALLS" in text and "No space left on device" in text

    def test_failed_intent_sync_refuses_the_call_and_halts(self, sandbox: Sandbox) -> None:
        """fdatasync fails at the intent: local_failure, zero requests at the remote, daemon halted."""
        url = setup_remote(sandbox)
        flag = sandbox.root / "fail-fdatasync"
        start_failing_daemon(sandbox, flag, *daemon_args(sandbox, url))
        assert sandbox.status()["halted"] is None
        # the session and a read recorded first, then the fault: the create's intent is the first
        # record to meet it (its session's record, met by a 5 ms group commit, halted the daemon
        # before the call on a loaded host: "stopped serving calls", not the intent's refusal)
        read, first, later, lookup = agent_call(sandbox, (
            one_call(READ) + "open(sys.argv[1], 'w').close()\n"
            "r = client.call('create_issue', {'title': 'audit'})\n"
            "out(r)\n" + one_call(READ) +
            "out(client.lookup(correlation_id=r.correlation_id))\n"), str(flag))
        assert read["category"] == "success", read
        assert first["category"] == "local_failure"
        assert "could not record the intent" in first["message"]
        assert "before anything was sent" in first["message"]
        assert "fdatasync" in first["message"] and "Input/output error" in first["message"]
        # a failed fsync is never retried: later calls are refused outright, even reads
        assert later["category"] == "local_failure"
        assert "stopped serving calls" in later["message"] and "nothing was sent" in later["message"]
        # ... and so are lookups: a halted vault uses no credential at all
        assert lookup["category"] == "local_failure" and "stopped serving calls" in lookup["message"]
        # the read before the fault reached the remote; nothing after it did
        assert [e.get("route") for e in remote_events(url) if e.get("event") == "received"] == ["read_issue"]
        assert effects(url) == 0
        assert "fdatasync" in sandbox.status()["halted"]
        text = status_text(sandbox)
        assert "NOT SERVING CALLS" in text and "fdatasync" in text

    @pytest.mark.parametrize("fault", ["write", "fdatasync"])
    def test_only_a_write_without_room_resumes_once_the_fault_is_gone(self, sandbox: Sandbox, fault: str) -> None:
        """Every audit write fails ENOSPC (`write`) or every fdatasync EIO (`fdatasync`): a read is
        refused, nothing sent; then the fault goes away. The write's failure lost nothing: status
        clears within seconds and calls are served without a restart, the log intact. The failed
        fdatasync never resumes (after one the page cache's state is unknown: PostgreSQL's
        "fsyncgate"): over three resume periods status still says why, a read is still refused."""
        from vault.daemon.recorder import RESUME_EVERY_S
        url = setup_remote(sandbox)
        flag = sandbox.root / "fail-audit"
        start_failing_daemon(sandbox, flag, *(["--fail-writes"] if fault == "write" else []),
                             *daemon_args(sandbox, url))
        flag.touch()
        first = agent_call(sandbox, one_call(READ))[0]
        assert "local_failure" == first["category"] and "before anything was sent" in first["message"], first
        flag.unlink()
        if fault == "write":
            wait_for(lambda: sandbox.status()["halted"] is None, timeout=30, what="calls served again")
            assert ["success"] == [r["category"] for r in agent_call(sandbox, one_call(READ))]
            assert 1 == len([e for e in remote_events(url) if e.get("event") == "received"])
            resumed = [e for e in events(sandbox) if e["type"] == "log_resumed"]
            # the one call refused was the one whose write failed: it counts
            assert [("log_resumed", 1)] == [(e["type"], e["refused_calls"]) for e in resumed], resumed
            assert "intact" == audit_verified_intact(sandbox)["status"]
            return
        # nothing to wait for (no resume is ever tried): watch it stay halted for three periods
        ends = time.monotonic() + 3 * RESUME_EVERY_S
        while time.monotonic() < ends:
            assert "fdatasync" in (sandbox.status() or {}).get("halted", "")
            time.sleep(0.1)  # the poll's pace
        later = agent_call(sandbox, one_call(READ))[0]
        assert "local_failure" == later["category"] and "stopped serving calls" in later["message"]
        assert [] == remote_events(url)
        assert "resumed" not in (sandbox.root / "daemon.stderr").read_text()

    def held_create(self, sandbox: Sandbox, *extra: str) -> tuple[str, Path, Path, Any]:
        """A failing daemon and an agent whose first create the remote has committed and holds:
        its intent sync is behind us. Returns (remote url, fail flag, agent output, agent)."""
        url = setup_remote(sandbox, fault="late_response_after_commit")
        flag = sandbox.root / "fail-audit"
        start_failing_daemon(sandbox, flag, *extra, *daemon_args(sandbox, url))
        out = sandbox.root / "agent.jsonl"
        agent = spawn_agent(sandbox, "stub", 2, "cr", out)
        wait_for(lambda: [e for e in remote_events(url) if e.get("event") == "response_write_delayed"],
                 what="the remote to commit the create")
        return url, flag, out, agent

    def test_failed_result_sync_in_strict_mode_gives_outcome_unknown(self, sandbox: Sandbox) -> None:
        """--durability strict: the intent is durable and the remote committed; then the result's
        fdatasync fails: outcome_unknown, and the daemon halts."""
        url, flag, out, agent = self.held_create(sandbox, "--durability", "strict")
        flag.touch()
        httpx.post(f"{url}/_sim/release", headers=sim_headers(url), timeout=10).raise_for_status()
        agent.wait(timeout=60)
        first, later = answered(read_lines(out))
        assert first["category"] == "outcome_unknown"
        assert "could not be recorded" in first["message"]
        assert effects(url) == 1  # it did happen: that is why the agent must not assume either way
        assert later["category"] == "local_failure" and "stopped serving calls" in later["message"]
        # only the first call ever reached the remote
        assert {e.get("correlation_id") for e in remote_events(url)} == {first["cid"]}
        text = status_text(sandbox)
        assert "NOT SERVING CALLS" in text and "fdatasync" in text

    def test_failed_result_write_gives_outcome_unknown(self, sandbox: Sandbox) -> None:
        """Default durability: the result record cannot even be written after the remote
        committed: outcome_unknown (never a success the log cannot back), and the daemon halts."""
        url, flag, out, agent = self.held_create(sandbox, "--fail-writes")
        flag.touch()
        httpx.post(f"{url}/_sim/release", headers=sim_headers(url), timeout=10).raise_for_status()
        agent.wait(timeout=60)
        first, later = answered(read_lines(out))
        assert first["category"] == "outcome_unknown"
        assert "could not be recorded" in first["message"]
        assert effects(url) == 1
        assert later["category"] == "local_failure" and "stopped serving calls" in later["message"]
        assert {e.get("correlation_id") for e in remote_events(url)} == {first["cid"]}
        text = status_text(sandbox)
        assert "NOT SERVING CALLS" in text and "write" in text and "No space left on device" in text

    def test_failed_result_sync_by_default_halts_after_the_answer(self, sandbox: Sandbox) -> None:
        """Default durability: the answer does not wait for the result's fdatasync, so the
        call is told what happened (its record was written); the failed sync, started by
        the flush timer, halts the daemon, and the next call is refused before the remote."""
        url, flag, out, agent = self.held_create(sandbox)
        flag.touch()
        httpx.post(f"{url}/_sim/release", headers=sim_headers(url), timeout=10).raise_for_status()
        agent.wait(timeout=60)
        first, later = answered(read_lines(out))
        assert first["category"] == "success"
        assert later["category"] == "local_failure"  # by the timer's failed sync, or its own intent's
        assert re.search(r"(nothing|before anything) was sent", later["message"]), later
        assert {e.get("correlation_id") for e in remote_events(url)} == {first["cid"]}
        assert "fdatasync" in (sandbox.status() or {}).get("halted", "")
        # what the log holds: the answered call's result record, written before the answer
        assert first["cid"] in {ev["correlation_id"] for ev in events(sandbox) if ev["type"] == "classification"}


# ---- single writer, concurrency -----------------------------------------------------


class TestSingleWriter:
    def test_second_writer_on_a_live_log_is_refused(self, sandbox: Sandbox) -> None:
        """While the daemon runs, another process opening its audit log for writing is refused."""
        url = setup_remote(sandbox)
        sandbox.start_daemon(*daemon_args(sandbox, url))
        agent_call(sandbox, one_call(CREATE))
        log = sandbox.home / "audit.log"
        before = log.read_bytes()
        key = audit_key(sandbox)
        signing = load_or_create_signing_key(sandbox.home, key)
        with pytest.raises(AuditError, match="held by another writer"):
            AuditWriter.open(log, key, signing)
        assert log.read_bytes() == before
        (r,) = agent_call(sandbox, one_call(CREATE))  # the daemon's writer is unaffected
        assert r["category"] == "success"

    def test_eight_concurrent_agents_no_lost_or_duplicate_seq(self, sandbox: Sandbox) -> None:
        """8 agent processes at once: seqs 0..N-1, every call's records exactly once each."""
        url = setup_remote(sandbox)
        daemon = sandbox.start_daemon(*daemon_args(sandbox, url))
        outs = [sandbox.root / f"agent-{a}.jsonl" for a in range(8)]
        procs = [spawn_agent(sandbox, f"agent-{a}", 12, "crr" if a % 2 else "rcc", out)
                 for a, out in enumerate(outs)]
        for p in procs:
            assert p.wait(timeout=60) == 0
        stop_process(daemon)
        assert verify(sandbox.home / "audit.log").status == "intact"
        evs = events(sandbox)
        assert [ev["seq"] for ev in evs] == list(range(len(evs)))
        per_type = {t: Counter(ev["correlation_id"] for ev in evs if ev["type"] == t) for t in CALL_TYPES}
        all_cids: set[str] = set()
        for out in outs:
            lines = read_lines(out)
            assert len(lines) == 12 and all(line.get("category") == "success" for line in lines), lines
            cids = [line["cid"] for line in lines]
            assert len(set(cids)) == 12
            all_cids.update(cids)
            for t in CALL_TYPES:
                assert all(per_type[t][cid] == 1 for cid in cids), t
        for t in CALL_TYPES:  # and no call the agents did not make
            assert set(per_type[t]) == all_cids, t
        assert Counter(ev["type"] for ev in evs)["session_opened"] == 8


# ---- what the log holds ----------------------------------------------------------------


class TestContents:
    def test_canary_credential_never_in_the_audit_files(self, sandbox: Sandbox) -> None:
        """The plaintext credential is in none of audit.log/.head/.key/.pub, nor in any event."""
        secret = canary()
        url = setup_remote(sandbox, secret=secret)
        daemon = sandbox.start_daemon(*daemon_args(sandbox, url))
        results = agent_call(sandbox, one_call(CREATE) + one_call(READ)
                             + one_call(("read_issue", {"issue_id": "ISS-404"})))
        assert results[0]["category"] == "success"
        assert any(not r["ok"] for r in results)  # a failure too (diagnostics path)
        stop_process(daemon)
        names = ("audit.log", "audit.head", "audit.key", "audit.pub")
        for name in names:
            data = (sandbox.home / name).read_bytes()
            assert data and secret.encode() not in data, name
        evs = events(sandbox)
        assert {r["correlation_id"] for r in results} <= {ev.get("correlation_id") for ev in evs}
        assert secret not in json.dumps(evs)

    def test_show_correlation_gives_the_history_of_a_timed_out_create(self, sandbox: Sandbox) -> None:
        """A create that times out after committing, then a lookup: `audit show --correlation`."""
        url = setup_remote(sandbox, fault="late_response_after_commit")
        config = sandbox.write("daemon.yaml", "call_timeout_s: 1\n")
        sandbox.start_daemon(*daemon_args(sandbox, url, "--config", str(config)))
        create, found = agent_call(sandbox, (
            "r = client.call('create_issue', {'title': 'timed out'})\n"
            "out(r)\n"
            "out(client.lookup(correlation_id=r.correlation_id))\n"))
        assert create["category"] == "outcome_unknown"
        assert found["reconciled"] == "found"
        assert effects(url) == 1
        cid = create["correlation_id"]
        out = sandbox.vaultsim("audit", "show", "--correlation", cid, "--json")
        assert out.returncode == 0, out.stderr
        history = json.loads(out.stdout)["events"]
        # the classification carries the executor's result (no remote_result record of its own)
        assert [ev["type"] for ev in history] == [
            "call_requested", "intent", "client_timeout", "classification", "reconciliation", "classification"]
        times = [ev["time"] for ev in history]
        assert times == sorted(times)
        call, told = history[0], history[3]
        assert (call["operation"], call["target"]) == ("create_issue", "create_issue on tracker")
        assert told["category"] == "outcome_unknown"
        assert told["remote_touched"] is True
        reconciliation, answer = history[4], history[5]
        assert reconciliation["reconciled"] == "found"
        assert reconciliation["correlation_id"] == answer["correlation_id"] == found["correlation_id"]
        assert reconciliation["lookup_of"] == cid
        text = sandbox.vaultsim("audit", "show", "--correlation", cid)
        assert text.returncode == 0, text.stderr
        assert text.stdout.startswith(f"correlation {cid}: 6 events")
        assert "outcome_unknown" in text.stdout and "reconciled=found" in text.stdout
