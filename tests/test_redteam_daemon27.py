"""Red team 27: hostile clients against the daemon itself, each beside a careful one.

DESIGN.md's wire protocol: bad input "never kills, halts or stalls the daemon or
another client", and limits hold per process and in all. In every test a
hostile client (tests/agents/rt27d_x.py, stdlib only, raw lines on the real
sockets) runs against one real daemon while a careful agent (the project's
client) does ordinary work; the test checks what a user would: the careful
calls all succeed within a generous deadline, the daemon still answers, the
hostile client is told why in clear JSON-RPC errors, every call the careful
agent was answered has its audit records and the log verifies, and the planted
credential shows up nowhere.

Found and fixed here (each test below failed before its fix):
* a line of 1 MiB + 1 byte with no newline (the last one before the client shut
  its write side) was read as a request; a line that long with its newline was
  refused -32600. Both are refused now.
* an agent naming another agent's correlation id with `lookup` and an
  `operation` was sent to the remote and told what that call created (the
  daemon already refused to answer it from its own memory). Now it is told
  nothing (`reconciled: unknown`) and the remote is not asked.
* a storm of connects filled the daemon's accept queue: the project's client (with a
  timeout, so connecting without blocking) was told EAGAIN and said "no vaultsim daemon
  answers", and a scripted approver started then crashed with an internal error (asyncio
  took the EAGAIN for a connection made). Both now wait for room until their timeout.
* requests in progress were bounded per connection only (64): a process with 250 connections
  held 16,000 day-long `call.resume` waits (~90 MiB of tasks). Now also 1,024 per process,
  4,096 per process tree and 32,768 in all (vault.daemon.processes, begin_request).
* a flooder (refused for too many waiting prompts) killed while its prompts waited kept them
  in front of a person until their deadline whenever the daemon saw the exit before the
  connections' close: the exit forgot the flooder mark first. They are withdrawn now.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import (PY, ROOT, Sandbox, audit_verified_intact, canary, new_sandbox, remote_events,
                     wait_for)
from hostile_fixtures import agent_env, run_script
from vault.daemon.limits import (MAX_CONNECTIONS_PER_PROCESS, MAX_IN_FLIGHT, MAX_IN_FLIGHT_PER_PROCESS,
                                 MAX_PENDING_PER_PROCESS, MAX_SESSIONS_PER_PROCESS)

HOSTILE = ROOT / "tests" / "agents" / "rt27d_x.py"
DEADLINE_S = 60.0  # generous: the careful agent's whole run, on a loaded 2-core machine

CAREFUL = (
    "client.open_session('careful', 'run-1')\n"
    "cids, cats, slowest = [], [], 0.0\n"
    "for i in range(int(sys.argv[1])):\n"
    "    t0 = time.monotonic()\n"
    "    r = client.call('read_issue', {'issue_id': 'ISS-1'})\n"
    "    slowest = max(slowest, time.monotonic() - t0)\n"
    "    cids.append(r.correlation_id); cats.append(str(r.category))\n"
    "r = client.call('create_issue', {'title': 'careful ' + sys.argv[2]}, idempotency_key='careful-' + sys.argv[2],"
    " wait_s=30)\n"
    "cids.append(r.correlation_id); cats.append(str(r.category))\n"
    "out({'cids': cids, 'categories': cats, 'slowest': slowest, 'data': r.data})\n"
)


class World:
    """One daemon with a fake remote holding a canary credential, and an approver that allows
    the careful agent's prompts and leaves the hostile ones waiting."""

    def __init__(self, box: Sandbox, *daemon_args: str) -> None:
        self.box = box
        self.secret = canary()
        _, self.url = box.start_remote({"tracker_token": self.secret})
        box.set_secret("tracker_token", self.secret)
        box.start_daemon("--remote", self.url, *daemon_args)
        box.start_approver([{"match": {"agent": "careful"}, "decide": "allow_once"},
                            {"match": {}, "decide": "ignore"}])
        self.daemon = psutil.Process(box.status()["pid"])  # type: ignore[index]
        self.outputs: list[str] = []
        self.careful_runs = 0

    def hostile(self, mode: str, *args: str) -> subprocess.Popen[str]:
        """Start the hostile client; returns once it printed its first line (what it holds)."""
        proc = self.box.world.start_agent([PY, str(HOSTILE), mode, *args], env=agent_env(self.box),
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return proc

    def first_line(self, proc: subprocess.Popen[str]) -> dict[str, Any]:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "the hostile client ended silently"
        self.outputs.append(line)
        return json.loads(line)  # type: ignore[no-any-return]

    def finish(self, proc: subprocess.Popen[str]) -> dict[str, Any]:
        """Tell a holding client to let go; its last line."""
        out, err = proc.communicate("go\n", timeout=120)
        self.outputs += [out, err]
        assert proc.returncode == 0, err[-2000:]
        return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]

    def run_hostile(self, mode: str, *args: str) -> dict[str, Any]:
        return self.finish(self.hostile(mode, *args))

    def careful(self, reads: int = 10) -> dict[str, Any]:
        """The careful agent's run: every call succeeds, within the deadline."""
        self.careful_runs += 1
        t0 = time.monotonic()
        got: dict[str, Any] = run_script(self.box, CAREFUL, str(reads), str(self.careful_runs),
                                         timeout=DEADLINE_S)[-1]
        took = time.monotonic() - t0
        assert ["success"] * (reads + 1) == got["categories"], got
        assert took < DEADLINE_S and got["slowest"] < 10.0, (took, got["slowest"])
        self.outputs.append(json.dumps(got))
        return got

    def alive(self) -> dict[str, Any]:
        assert self.daemon.is_running() and self.daemon.status() != psutil.STATUS_ZOMBIE
        status = self.box.status()
        assert status is not None, "the daemon no longer answers vault.status"
        return status

    def whole(self, *carefuls: dict[str, Any]) -> None:
        """The log verifies, every careful call answered has its intent and result records, and the
        canary is in no output, log line or diagnostic-free file an agent or a reader sees."""
        self.alive()
        audit_verified_intact(self.box, timeout=30)
        shown = self.box.vaultsim("audit", "show", "--json", timeout=120)
        assert 0 == shown.returncode, shown.stderr[-2000:]
        types: dict[str, set[str]] = {}
        for ev in json.loads(shown.stdout)["events"]:
            if ev.get("correlation_id"):
                types.setdefault(ev["correlation_id"], set()).add(ev["type"])
        for run in carefuls:
            for cid in run["cids"]:
                assert {"intent", "classification"} <= types.get(cid, set()), (cid, types.get(cid))
        seen = "\n".join(self.outputs) + shown.stdout + (self.box.root / "daemon.stderr").read_text()
        assert self.secret not in seen


@pytest.fixture
def world() -> Iterator[World]:
    box = new_sandbox()
    try:
        yield World(box)
    finally:
        box.close()
        subprocess.run(["rm", "-rf", "--one-file-system", str(box.root)], capture_output=True)


def rss(w: World) -> int:
    return int(w.daemon.memory_info().rss)


class TestFramesAtTheBound:
    def test_one_mib_is_read_and_one_byte_more_is_refused_with_or_without_its_newline(self, world: World) -> None:
        """A line of exactly 1 MiB is a request (answered for its too-long parameter, -32602); one
        byte more is refused -32600 naming the bound, also when it is the last line with no
        newline (it was read as a request)."""
        seen = world.run_hostile("frames")["frames"]
        assert -32602 == seen["1MiB"][0] and -32602 == seen["1MiB-no-newline"][0]
        for key in ("1MiB+1", "1MiB+1-no-newline"):
            assert [-32600, "invalid request: frame larger than 1 MiB"] == seen[key], seen
        world.whole(world.careful())


class TestHostileValues:
    def test_each_is_named_by_its_code_and_the_connection_serves_on(self, world: World) -> None:
        """NaN, Infinity, 1e999, a 5,000-digit number, invalid UTF-8, lone surrogates in the method
        and in operation names, NUL bytes, 100k nested brackets, and hostile agent names: each is
        a clear error on the same connection, which then serves vault.status; a duplicated key
        takes its last value, as JSON parsers do."""
        got = world.run_hostile("junk")
        codes, names = got["codes"], got["names"]
        assert {"nan-id": -32600, "inf-param": -32602, "nan-wait": -32602, "nan-in-op-params": -32602,
                "huge-float": -32602, "huge-int": -32700, "invalid-utf8-method": -32700,
                "invalid-utf8-param": -32700, "surrogate-method": -32600, "surrogate-op": -32602,
                "deep-100k": -32700, "deep-params": -32700, "nul-bytes": -32700}.items() <= codes.items(), codes
        assert "ok" == codes["huge-int-id"] and "ok" == codes["dup-method"] and "success" == codes["dup-session"]
        assert {"surrogate": -32602, "invalid-utf8": -32700, "nan": -32602, "huge": -32602, "escape": -32602,
                "bidi": -32602, "long": -32602, "dup": "ok"} == names
        assert "ok" == got["still_serves"]
        world.whole(world.careful())


    @pytest.mark.timeout(300)
    def test_frames_costly_to_parse_slow_the_careful_agent_but_never_stall_it(self, world: World) -> None:
        """Two processes each send 100 frames of ~1 MiB: operation params of 80,000 keys (about
        75 ms of the daemon's time each) or 170,000 escapes. Each is refused -32602; the careful
        agent's calls all succeed beside them, none waiting seconds."""
        keys, escapes = world.hostile("heavy", "100", "keys"), world.hostile("heavy", "100", "escapes")
        for h in (keys, escapes):
            assert world.first_line(h)["frame"] > 1_000_000
        careful = world.careful(20)
        for h in (keys, escapes):
            assert {"-32602": 100} == world.finish(h)["codes"]
        world.whole(careful)


class TestBackedUpWrites:
    @pytest.mark.timeout(300)
    def test_ten_thousand_requests_never_read_hold_no_memory_and_stall_no_one(self, world: World) -> None:
        """10,000 `catalog` requests written without reading a byte: the daemon stops reading the
        connection once its answers back up (the client's writes block), its memory stays flat,
        the careful agent is served at once, and the flooder, reading at last, gets an answer for
        every request it got written: a result, or -32004 past 64 in progress."""
        before = rss(world)
        flood = world.hostile("pipeline", "10000", "catalog")
        held = world.first_line(flood)
        assert held["written"] < held["of"]  # the daemon stopped taking them: back-pressure, not a buffer
        careful = world.careful()
        assert rss(world) - before < 64 << 20
        done = world.finish(flood)
        assert not done["closed_by_daemon"]
        assert set(done["codes"]) <= {"ok", str(-32004)} and done["codes"].get("ok", 0) >= MAX_IN_FLIGHT, done
        world.whole(careful)


class TestSlowClients:
    @pytest.mark.timeout(300)
    def test_slowloris_connections_and_a_one_byte_a_second_reader_stall_no_one(self, world: World) -> None:
        """300 connections writing a request a byte at a time, and a client that asked for 200
        catalogs and reads one byte a second: the careful agent is served as usual; each slow
        request is answered once its line is whole, and the connections past the process's 256
        are refused -32004."""
        before = rss(world)
        loris = world.hostile("slowloris", "300")
        trickle = world.hostile("trickle", "200")
        assert 300 == world.first_line(loris)["held"]
        world.first_line(trickle)
        careful = world.careful(20)
        assert rss(world) - before < 64 << 20
        # one process holds at most 256 connections: the rest were refused as they were accepted
        assert {"ok": MAX_CONNECTIONS_PER_PROCESS, "-32004": 300 - MAX_CONNECTIONS_PER_PROCESS} == \
            world.finish(loris)["codes"]
        world.finish(trickle)
        world.whole(careful)


class TestStorms:
    @pytest.mark.timeout(300)
    def test_connect_close_storm_and_a_wrong_token_hello_flood_leave_the_approver_deciding(
            self, world: World) -> None:
        """3,000 connects closed at once (half after half a request) and 2,000 hellos with no,
        empty or wrong tokens on the approver socket (plus 200 on fresh connections), all while
        the careful agent's create_issue waits for the real approver: it is decided and runs;
        every hello is refused (-32602 or -32001) and nothing is done for an unhelloed decide,
        lock or unlock."""
        storm = world.hostile("storm", "3000")
        world.first_line(storm)
        hello = world.hostile("hello", "2000")
        careful = world.careful()
        s, h = world.finish(storm), world.finish(hello)
        assert (0, "ok") == (s["refused"], s["after"])
        assert set(h["codes"]) <= {"-32602", "-32001"} and 2000 == sum(h["codes"].values()), h
        assert {"-32001": 200} == h["fresh"]
        assert {"decide": -32001, "lock": -32001, "unlock": -32001} == h["unhelloed"]
        status = world.alive()
        assert not status["locked"] and 1 == status["approvers"]
        world.whole(careful)


    @pytest.mark.timeout(300)
    def test_an_approver_connecting_during_a_storm_on_its_socket_subscribes_and_decides(
            self, world: World) -> None:
        """Three processes connect and close 20,000 times each on the approver socket, filling its
        accept queue. A scripted approver started then crashed ("internal error": asyncio took
        the full queue's EAGAIN for a connection made, then lost it); now its connect waits for
        room, it subscribes, and it decides the careful agent's prompt."""
        storms = [world.hostile("storm", "20000", "approver") for _ in range(3)]
        for s in storms:
            assert {"storming": "approver"} == world.first_line(s)
        before = world.alive()["approvers"]
        world.box.start_approver([{"match": {"agent": "careful"}, "decide": "allow_once"}], name="late")
        assert before + 1 == world.alive()["approvers"]
        careful = world.careful(2)
        for s in storms:
            assert -32601 == world.finish(s)["after"]  # vault.status is no approver method: still answered
        world.whole(careful)


class TestRequestsInProgress:
    @pytest.mark.timeout(300)
    def test_a_process_holding_day_long_waits_on_every_connection_gets_its_share(self, world: World) -> None:
        """Two processes each write 64 `call.resume` requests with a day's `wait_s` on each of 250
        connections (16,000 waits each). Only 64 per connection were bounded: the daemon held
        32,000 waiting tasks and grew by ~176 MiB. Now a process has at most 1,024 in progress
        across its connections, the rest answered -32004 at once saying so; the daemon grows
        little and the careful agent works beside them."""
        before = rss(world)
        holders = [world.hostile("waiters", "250", "64") for _ in range(2)]
        for h in holders:
            got = world.first_line(h)
            assert {"-32004": 250 * 64 - MAX_IN_FLIGHT_PER_PROCESS} == got["immediate"], got
            assert "from this process" in got["why"]
        assert rss(world) - before < 64 << 20
        careful = world.careful()
        for h in holders:
            h.communicate("go\n", timeout=60)
        world.whole(careful)


class TestManySessions:
    def test_a_process_opening_thousands_gets_its_share_and_the_careful_agent_opens_its_own(
            self, world: World) -> None:
        """A process opening 20,000 sessions over as many connections as it takes gets 256 and
        then -32004 saying the limit is this process's; the careful agent opens a session and
        works while they are held."""
        flood = world.hostile("sessions", "20000")
        got = world.first_line(flood)
        assert MAX_SESSIONS_PER_PROCESS == got["opened"], got
        assert -32004 == got["refusal"][0] and "this process" in got["refusal"][1]
        careful = world.careful()
        world.finish(flood)
        wait_for(lambda: world.alive()["sessions"] == 0, timeout=30, what="the flood's sessions to end")
        world.whole(careful)


class TestStoppedHolder:
    @pytest.mark.timeout(300)
    def test_a_sigstopped_client_holding_its_prompts_neither_blocks_nor_keeps_them(self, world: World) -> None:
        """A process asks 80 gated calls with wait_s 0 (64 wait, the rest are rate_limited), then
        is stopped with SIGSTOP: the careful agent's own prompt reaches the approver and its call
        runs; once the stopped process is killed its prompts are withdrawn."""
        holder = world.hostile("pending", "create_issue", "80")
        got = world.first_line(holder)
        assert {"approval_pending": MAX_PENDING_PER_PROCESS,
                "rate_limited": 80 - MAX_PENDING_PER_PROCESS} == got["categories"], got
        holder.send_signal(signal.SIGSTOP)
        careful = world.careful()
        assert MAX_PENDING_PER_PROCESS == world.alive()["pending"]
        holder.kill()
        holder.wait(timeout=30)
        wait_for(lambda: world.alive()["pending"] == 0, timeout=30, what="the stopped client's prompts to go")
        world.whole(careful)


    @pytest.mark.timeout(300)
    def test_twelve_processes_each_at_their_share_leave_room_for_another(self, world: World) -> None:
        """Twelve processes each ask 70 gated calls with wait_s 0 over three sessions: each gets
        its 64 waiting prompts and 6 rate_limited (the per-process cap, not a global one
        reached by the first), 768 wait in all, and the careful agent's prompt still reaches
        the approver and runs; when they are killed every one of their prompts is withdrawn."""
        holders = [world.hostile("pending", "create_issue", "70") for _ in range(12)]
        for h in holders:
            assert {"approval_pending": MAX_PENDING_PER_PROCESS,
                    "rate_limited": 70 - MAX_PENDING_PER_PROCESS} == world.first_line(h)["categories"]
        assert 12 * MAX_PENDING_PER_PROCESS == world.alive()["pending"]
        careful = world.careful()
        for h in holders:
            h.kill()
            h.wait(timeout=30)
        wait_for(lambda: world.alive()["pending"] == 0, timeout=60, what="the killed processes' prompts to go")
        world.whole(careful)


class TestOtherAgentsCalls:
    def test_forged_and_borrowed_tokens_and_ids_tell_the_forger_nothing(self, world: World) -> None:
        """Another agent presents the careful agent's correlation id to call.resume, lookup (with
        and without naming the operation) and call.cancel, and forged resume tokens: resume and
        cancel are -32602, and the lookup reconciles nothing (`unknown`, no data), where naming
        the operation used to ask the remote and return what the careful call created."""
        careful = world.careful(1)
        created = careful["cids"][-1]
        got = world.run_hostile("forge", json.dumps([[created, created]]))
        seen = got["seen"]
        assert all(code == -32602 for kind, code in seen if kind in ("resume", "cancel")), seen
        lookups = [v for kind, v in seen if kind == "lookup"]
        assert [["success", "unknown", None]] * 2 == lookups
        assert careful["data"]["id"] not in got["text"]
        world.whole(careful)

    def test_a_lookup_flood_is_answered_and_the_careful_agent_is_not_slowed(self, world: World) -> None:
        """2,000 lookups of made-up correlation ids as fast as answers come: each answered, the
        careful agent served as usual beside them."""
        flood = world.hostile("lookups", "2000")
        careful = world.careful(20)
        got = world.finish(flood)
        assert 2000 == sum(got["codes"].values()) and set(got["codes"]) <= {"success"}, got
        world.whole(careful)


UNTIL_REFUSED = ("client.open_session('careful', 'run-1')\n"
                 "for _ in range(200):\n"
                 "    r = client.call('read_issue', {'issue_id': 'ISS-1'})\n"
                 "    if str(r.category) != 'success':\n"
                 "        out(r)\n"
                 "        break\n")


@pytest.fixture
def on_small_disk() -> Iterator[tuple[World, Any]]:
    """A world whose vault home (audit log included) is a 1 MiB tmpfs. Root only (mount)."""
    from test_full_disk import SmallDisk
    box = new_sandbox()
    home = box.root / "h"
    home.mkdir(mode=0o700)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(home)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        box.close()
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield World(box), SmallDisk(home)
    finally:
        box.close()
        subprocess.run(["umount", "-l", str(home)], capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", str(box.root)], capture_output=True)


def _refused_from_then_on(got: dict[str, Any], why: Callable[[str], bool]) -> None:
    """The flood's answers: successes, then at most one `outcome_unknown` (the call in flight when
    the log failed: its intent was written and the remote may have it, its answer's record could
    not be, as the README's failure table says), then `local_failure` naming why, to the end."""
    cats = [cat for cat, _, _ in got["answered"]]
    assert set(cats) <= {"success", "local_failure", "outcome_unknown"}, got["categories"]
    assert cats.count("outcome_unknown") <= 1, got["categories"]
    assert "local_failure" in cats, got["categories"]
    first = cats.index("local_failure")
    assert set(cats[first:]) == {"local_failure"} and "outcome_unknown" not in cats[:max(first - 1, 0)], \
        got["categories"]
    assert why(got["answered"][-1][2]), got["answered"][-1]


class TestFailingDisk:
    @pytest.mark.timeout(300)
    def test_a_disk_filling_under_a_flood_refuses_calls_unaudited_none_and_the_log_verifies(
            self, on_small_disk: tuple[World, Any]) -> None:
        """The audit log's disk fills while a hostile client calls as fast as it can: every call
        from then on is refused `local_failure` naming ENOSPC (for both clients), the daemon stays
        up and says why it serves no calls, every request the remote received had its intent in
        the log first, and every answered success has its records. Freeing the space resumes
        calls without a restart (a write that failed for room lost nothing: README "Audit log";
        it pinned "halted until a restart" before): status clears, reads are served, and the log
        verifies intact with a `log_resumed` record."""
        world, disk = on_small_disk
        careful = world.careful()
        flood = world.hostile("reads")
        world.first_line(flood)
        disk.fill()
        refused = run_script(world.box, UNTIL_REFUSED, timeout=DEADLINE_S)[0]
        assert "local_failure" == refused["category"] and "ENOSPC" in refused["message"], refused
        halted = wait_for(lambda: world.alive()["halted"], timeout=30, what="status to say calls stopped")
        assert "ENOSPC" in halted
        got = world.finish(flood)
        _refused_from_then_on(got, lambda message: "ENOSPC" in message)
        os.unlink(disk.filler)
        wait_for(lambda: world.alive()["halted"] is None, timeout=30, what="calls served again, no restart")
        again = run_script(world.box, UNTIL_REFUSED.replace("range(200)", "range(3)"), timeout=DEADLINE_S)
        assert [] == again  # three reads, none refused
        shown = json.loads(world.box.vaultsim("audit", "show", "--json", timeout=120).stdout)
        intents = {ev["correlation_id"] for ev in shown["events"] if ev["type"] == "intent"}
        received = {e["correlation_id"] for e in remote_events(world.url) if e.get("event") == "received"}
        assert received and received <= intents, received - intents
        assert 1 == len([ev for ev in shown["events"] if ev["type"] == "log_resumed"])
        flood_ok = [cid for cat, cid, _ in got["answered"] if cat == "success"]
        world.whole(careful, {"cids": flood_ok})


@pytest.fixture
def on_failing_device() -> Iterator[tuple[World, Any]]:
    """A world whose vault home is an ext4 file system on a loop device whose backing file lives
    on an 8 MiB tmpfs: once that tmpfs is full, the device's writes fail and an fdatasync in the
    home says EIO (no device-mapper needed). Root only."""
    from test_full_disk import SmallDisk
    box = new_sandbox()
    outer, home = box.root / "outer", box.root / "h"
    outer.mkdir()
    home.mkdir(mode=0o700)
    loop = ""

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True)
    try:
        steps = [("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(outer)),
                 ("truncate", "-s", "64M", str(outer / "img")),
                 ("mkfs.ext4", "-q", "-E", "lazy_itable_init=1,lazy_journal_init=1", str(outer / "img"))]
        for argv in steps:
            done = run(*argv)
            if done.returncode != 0:
                pytest.skip(f"cannot build a failing device here ({argv[0]}): {done.stderr.strip()}")
        done = run("losetup", "-f", "--show", str(outer / "img"))
        if done.returncode != 0:
            pytest.skip(f"no loop device here: {done.stderr.strip()}")
        loop = done.stdout.strip()
        done = run("mount", "-o", "errors=continue", loop, str(home))
        assert done.returncode == 0, done.stderr
        home.chmod(0o700)
        yield World(box), SmallDisk(outer)
    finally:
        box.close()
        run("umount", "-l", str(home))
        if loop:
            run("losetup", "-d", loop)
        run("umount", "-l", str(outer))
        run("rm", "-rf", "--one-file-system", str(box.root))


def _device_error(text: str) -> bool:
    """The failing device's error named: ext4 over a loop device whose backing tmpfs is full
    reports a failed writeback as EIO, or (as seen on a loaded host) as the backing file's
    ENOSPC; either way the call is refused naming it."""
    return "EIO" in text or "ENOSPC" in text


class TestIOError:
    @pytest.mark.timeout(300)
    def test_an_eio_under_a_flood_refuses_calls_naming_it_and_the_daemon_stays(
            self, on_failing_device: tuple[World, Any]) -> None:
        """The audit log's device fails (fdatasync: EIO) while a hostile client calls as fast as
        it can: both clients' calls are refused `local_failure` naming EIO, nothing reaches the
        remote without its intent in the log, the daemon stays up saying why it serves no calls,
        and the canary is nowhere."""
        world, outer = on_failing_device
        careful = world.careful(3)
        flood = world.hostile("reads")
        world.first_line(flood)
        outer.fill()
        refused = run_script(world.box, UNTIL_REFUSED, timeout=DEADLINE_S)[0]
        assert "local_failure" == refused["category"] and _device_error(refused["message"]), refused
        got = world.finish(flood)
        _refused_from_then_on(got, _device_error)
        halted = world.alive()["halted"]
        assert _device_error(halted) and "Traceback" not in (world.box.root / "daemon.stderr").read_text()
        shown = json.loads(world.box.vaultsim("audit", "show", "--json", timeout=120).stdout)
        intents = {ev["correlation_id"] for ev in shown["events"] if ev["type"] == "intent"}
        received = {e["correlation_id"] for e in remote_events(world.url) if e.get("event") == "received"}
        assert set(careful["cids"]) <= received <= intents, received - intents
        world.outputs.append(json.dumps(got))
        text = "\n".join(world.outputs) + (world.box.root / "daemon.stderr").read_text()
        assert world.secret not in text


def _flood_run(tmp_path: Path, kind: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """One `vaultsim run` of flood-bot's two creates, flooding the bound `kind` names first."""
    plan = {"agent": "flood-bot", "steps": [{"call": "create_issue", "params": {"title": "pile 1"}},
                                            {"call": "create_issue", "params": {"title": "pile 2"}}],
            "final": "done: filed two issues"}
    scenario = {"title": "rt27d pile of waits", "approver": {"rules": [
        {"decide": "allow_session", "delay_s": {"min": 3, "max": 3}}]}, "task": {"deadline_s": 60},
        "agents": [{"plan": plan}], "expect": {"verdict": "PASS", "outcome": {"state": [
            {"collection": "issues", "where": {"title": "pile 1"}, "count": 1},
            {"collection": "issues", "where": {"title": "pile 2"}, "count": 1}], "claim": "done"}}}
    path = tmp_path / "rt27d-pile.yaml"
    path.write_text(json.dumps(scenario))
    report = tmp_path / "report.json"
    env = {**os.environ, "VAULTSIM_HOME": str(tmp_path / "home"), "RT27D_FLOOD": "flood-bot",
           "RT27D_FLOOD_KIND": kind}
    out = subprocess.run([PY, "-m", "vault.cli.main", "run", str(path), "--agent", f"{PY} {HOSTILE} agent",
                          "--json", str(report)], capture_output=True, text=True, timeout=250, cwd=tmp_path,
                         env=env)
    assert report.exists(), out.stdout[-3000:] + out.stderr[-3000:]
    return out, json.loads(report.read_text())["scenarios"][0]["trial_results"][0]


@pytest.fixture(scope="class")
def flood_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        dict[str, Future[tuple[subprocess.CompletedProcess[str], dict[str, Any]]]]]:
    """The three kinds' runs, each its own daemon and home, two at once (CI time: they took 53 s
    one after another on a loaded host); each test waits for its own."""
    pool = ThreadPoolExecutor(2)
    yield {kind: pool.submit(_flood_run, tmp_path_factory.mktemp(f"rt27d-{kind}"), kind)
           for kind in ("waits", "conns", "sessions")}
    pool.shutdown(wait=True, cancel_futures=True)   # one picked alone with -k: the others not started


class TestUnderTheRunner:
    @pytest.mark.timeout(600)
    def test_a_flooding_trial_beside_a_careful_one_leaves_it_passing_and_is_named(self, tmp_path: Path) -> None:
        """`vaultsim run -j 2` with one agent program in two scenarios: as `flood-bot` it first
        writes 10,000 requests it never reads and makes 2,000 lookups of made-up correlation ids,
        then does its steps; as `careful-bot` it just does them. The careful trial passes, in
        well under its deadline. The flooding one is FAIL_TOOL_ACCESS, named a request flood: past
        the 64 one connection may have in progress its requests were refused -32004, audited
        (`request_refused`, sampled) and graded against it (section 3; it passed before), so the
        run is blocked (the scenario expects PASS). Its lookups of made-up ids are not graded."""
        paths = []
        for agent in ("careful-bot", "flood-bot"):
            plan = (ROOT / "scenarios" / "plans" / "file-and-triage.yaml").read_text()
            (tmp_path / f"plan-{agent}.yaml").write_text(plan.replace("agent: triage-bot", f"agent: {agent}"))
            text = (ROOT / "scenarios" / "gate-1-healthy-delivery.yaml").read_text()
            text = text.replace("plans/file-and-triage.yaml", str(tmp_path / f"plan-{agent}.yaml"))
            text = text.replace("approvers/allow-session.yaml",
                                str(ROOT / "scenarios" / "approvers" / "allow-session.yaml"))
            paths.append(tmp_path / f"rt27d-{agent}.yaml")
            paths[-1].write_text(text.replace("Release gate 1", f"rt27d {agent}"))
        report = tmp_path / "report.json"
        env = {**os.environ, "VAULTSIM_HOME": str(tmp_path / "home"), "RT27D_FLOOD": "flood-bot"}
        out = subprocess.run([PY, "-m", "vault.cli.main", "run", *map(str, paths), "-j", "2", "--agent",
                              f"{PY} {HOSTILE} agent", "--json", str(report)],
                             capture_output=True, text=True, timeout=500, cwd=tmp_path, env=env)
        doc = json.loads(report.read_text())
        trials = {s["id"]: t for s in doc["scenarios"] for t in s["trial_results"]}
        careful, flood = trials["rt27d-careful-bot"], trials["rt27d-flood-bot"]
        assert ("PASS", True, []) == (careful["verdict"], careful["ok"], careful["reasons"]), careful["reasons"]
        assert "FAIL_TOOL_ACCESS" == flood["verdict"], flood["reasons"]
        named = [r for r in flood["reasons"] if "request flood" in r]
        assert named and "flood-bot" in named[0] and "at most 64 in progress" in named[0], flood["reasons"]
        assert 1 == out.returncode, out.stdout[-3000:] + out.stderr[-3000:]  # blocked: it expected PASS

    @pytest.mark.timeout(300)
    @pytest.mark.parametrize("kind, named_as", [
        ("waits", ("request flood", "at most 64 in progress", "on one connection")),
        ("conns", ("connection flood", "one of its processes held 256 connections", "the most one process may")),
        ("sessions", ("session flood", "opened 256 sessions on one connection", "one session per process"))])
    def test_a_flood_past_one_process_bound_is_named_and_its_steps_still_count(
            self, flood_runs: dict[str, Future[tuple[subprocess.CompletedProcess[str], dict[str, Any]]]],
            kind: str, named_as: tuple[str, ...]) -> None:
        """`flood-bot` does its two creates as the contract says, but first floods one bound a
        single process meets (section 3), each refused -32004 with nothing done: `waits` sends
        its first create with `wait_s: 0`, then writes 100 `call.resume`s of its token at once on
        one more connection, each willing to wait 20 s, while the person takes 3 s (64 held, 36
        refused); `conns` opens 300 connections from its one process (256 served); `sessions`
        opens 300 sessions on one connection (256 opened). Each trial is FAIL_TOOL_ACCESS naming
        the flood (all three passed before: the first and last were not audited, the second
        was recorded only for a whole process tree's share), and its steps took effect once each."""
        out, trial = flood_runs[kind].result()
        assert "FAIL_TOOL_ACCESS" == trial["verdict"], trial["reasons"]
        named = [r for r in trial["reasons"] if named_as[0] in r]
        assert len(named) == 1 and "flood-bot" in named[0] and all(w in named[0] for w in named_as), \
            trial["reasons"]
        assert not any("FAIL_OUTCOME" in r or "FAIL_DUPLICATE" in r for r in trial["reasons"]), trial["reasons"]
        assert 1 == out.returncode, out.stdout[-3000:] + out.stderr[-3000:]  # blocked: it expected PASS
