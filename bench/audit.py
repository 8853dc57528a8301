"""Audit log throughput: durable appends/s, durable gated calls/s, offline verify records/s.

    .venv/bin/python bench/audit.py [--appends N] [--calls N] [--verify-records N] [--dir DIR]

Runs in a fresh temporary directory (on the same filesystem as $TMPDIR, or in
DIR: `--dir /dev/shm` is tmpfs, where an fdatasync costs nothing) and prints
these figures:

* the disk's own write+fdatasync rate (context: every durable figure is bound by it);
* durable appends/s with one appender (each append waits for its fdatasync);
* durable appends/s with 8 concurrent appenders in one event loop (group
  commit: they share fdatasyncs), with the number of fdatasyncs it took;
* durable gated calls/s with 1, 8 and 32 concurrent agents (asyncio tasks,
  one session each, one call at a time), through a real `VaultDaemon`'s call
  pipeline (`daemon.calls.call`, in-process): the gate (real policy: `read_issue` is auto),
  the credential read from a real encrypted store, and every audit record of
  the call on the real `AuditWriter` (call_requested, intent [durable before
  the executor runs], remote_result, classification [written before the
  answer, synced by the next intent's group commit or the 5 ms timer]; group
  commit shares fdatasyncs between the agents), with the number of
  fdatasyncs it took; then 8 agents again with ``--durability strict`` (the
  classification synced before the answer too). Excluded: sockets, JSON-RPC
  framing, agent processes, HTTP and any remote: the executor is a stub that
  answers success at once without yielding to the event loop, so the agents
  interleave only where the pipeline waits for the audit log. The clock covers
  the calls only (not building the daemon, not the checks of the log after).
  The end-to-end figure (agent processes, Unix sockets, the HttpExecutor, the
  fake remote) is bench/gated_calls.py. Under the 8-agent figure, its
  ceiling on this disk: each fdatasync can cover at most the 8 agents' calls
  (one durable point per call), so at most 8 calls per write+fdatasync of a
  batch the size the run wrote, even if the calls cost no CPU; and the same 8
  agents with no disk, each fdatasync replaced by a sleep as long as that
  batch's sync: what is left is the calls' CPU plus what the host charges for
  idling that long between rounds (on a virtual machine, a vCPU that halted
  runs the next round's code measurably slower). Each gated row gives the
  process's CPU time per call;
* offline `verify` records/s over a 100k-record log (corpus written with
  fdatasync stubbed out, since only verify is being timed there).

Targets (issues #5, #19): durable gated calls with 8 agents >= 8k/s with the
default durability (meeting it here is necessary, not sufficient:
gated_calls.py adds the sockets and the remote); verify >= 400k records/s
(the soak, bench/soak.py, checks it over a rotated set of millions); 8
appenders >= 8k appends/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from vault.audit import AuditWriter, decrypt_events, verify  # noqa: E402
from vault.audit.adapter import open_audit  # noqa: E402
from vault.catalog import Operation  # noqa: E402
from vault.config import load_config  # noqa: E402
from vault.daemon.daemon import VaultDaemon  # noqa: E402
from vault.executors.base import CallContext, ExecOutcome, Executor, ServiceConfig  # noqa: E402
from vault.home import VaultHome  # noqa: E402
from vault.store.keyring_backend import FileKeyring  # noqa: E402
from vault.store.keystore import KeyStore  # noqa: E402
from vault.models import Category, Result, make_result  # noqa: E402
from vault.daemon.peer import ProcessIdentity  # noqa: E402
from vault.store.secret import Secret  # noqa: E402
from vault.daemon.sessions import Session  # noqa: E402
from vault.store.credentials import CredentialStore  # noqa: E402

EVENT = {"type": "call_requested", "correlation_id": "c-0190f3a2b4c5d6e7f8a9b0c1d2e3f4a5",
         "session_id": "s-0190f3a2b4c5d6e7f8a9", "operation": "create_deployment",
         "risk": "execute", "target": "api.example.test/deployments"}


class CountingIO:
    """os.write / os.fdatasync, counting the fdatasyncs and the bytes written."""

    def __init__(self, sync: bool = True) -> None:
        self.syncs = 0
        self.bytes = 0
        self.sync = sync

    def write(self, fd: int, data: Any) -> int:
        n = os.write(fd, data)
        self.bytes += n
        return n

    def fdatasync(self, fd: int) -> None:
        self.syncs += 1
        if self.sync:
            os.fdatasync(fd)


async def appenders(path: Path, key: bytes, sk: Ed25519PrivateKey, tasks: int, each: int,
                    io: CountingIO) -> float:
    w = AuditWriter.open(path, key, sk, io=io)

    async def one(i: int) -> None:
        for j in range(each):
            await w.append({**EVENT, "n": j, "task": i})

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(tasks)))
    elapsed = time.perf_counter() - t0
    w.close()
    return elapsed


async def bulk(path: Path, key: bytes, sk: Ed25519PrivateKey, n: int) -> None:
    w = AuditWriter.open(path, key, sk, io=CountingIO(sync=False))
    for start in range(0, n, 2000):
        await asyncio.gather(*(w.append({**EVENT, "n": i}) for i in range(start, min(n, start + 2000))))
    w.close()


class StubExecutor(Executor):
    """Answers success at once, "touching" the remote: the pipeline records it as sent."""

    kind = "http"

    async def execute(self, op: Operation, params: dict[str, Any], credential: Secret,
                      service: ServiceConfig, ctx: CallContext) -> ExecOutcome:
        return ExecOutcome(make_result(Category.success, op.name, ctx.correlation_id, "Done."), None, True)


CALL_EVENTS = ("call_requested", "intent", "classification")


def gated_daemon(root: Path, io: CountingIO, **writer_options: Any) -> tuple[VaultDaemon, AuditWriter, bytes]:
    """A daemon assembled as daemon_cli.build_daemon does, unlocked, never serving sockets;
    returned with its audit writer and audit key (to close and check the log afterwards)."""
    home = VaultHome(root / "home").ensure()
    # the embedded file keyring in a private dir: the user's keyring is never touched
    keystore = KeyStore(home, backend=FileKeyring(root / "keyring"))
    store = CredentialStore(home, keystore)
    store.set("tracker_token", "bench-token")
    # the URL only configures the tracker service (a missing one is refused); nothing dials it
    config = load_config(None, remote_url="http://127.0.0.1:9")
    audit_key = keystore.derive("audit")
    writer = open_audit(home, audit_key, io=io, **writer_options)
    daemon = VaultDaemon(home, config, unlocked=True, keyring_backend=keystore.backend_name(),
                         store=store, audit=writer, executors={"http": StubExecutor()})
    return daemon, writer, audit_key


class SleepIO(CountingIO):
    """No disk: each fdatasync is a sleep as long as this disk's. What is left of the
    8-agent rate is the call's CPU and what this host charges for idling that long."""

    def __init__(self, seconds: float) -> None:
        super().__init__(sync=False)
        self.seconds = seconds
        self.slept = 0.0  # in all: a sleep overshoots by the kernel's timer slack

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        t0 = time.perf_counter()
        time.sleep(self.seconds)
        self.slept += time.perf_counter() - t0


async def gated_calls(root: Path, agents: int, each: int, io: CountingIO,
                      **writer_options: Any) -> tuple[float, float]:
    daemon, writer, audit_key = gated_daemon(root, io, **writer_options)
    op = daemon.catalog.get("read_issue")
    me = ProcessIdentity.of(os.getpid(), os.getuid())
    assert me is not None
    sessions = [daemon.sessions.open(f"bench-{i}", "bench", me, f"conn-{i}") for i in range(agents)]

    async def agent(s: Session) -> list[Result]:
        return [await daemon.calls.call(s, op, {"issue_id": "ISS-1"}, None, None) for _ in range(each)]

    t0, cpu0 = time.perf_counter(), time.process_time()
    results = [r for rs in await asyncio.gather(*(agent(s) for s in sessions)) for r in rs]
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    writer.close()
    bad = [r for r in results if r.category is not Category.success]
    assert not bad, bad[0]
    # sanity: the log is intact and holds exactly the records of every call
    log = daemon.home.audit_log
    report = verify(log)
    calls = agents * each
    assert report.intact and report.records == len(CALL_EVENTS) * calls, report
    types = Counter(e["type"] for e in decrypt_events(log, audit_key))
    assert types == {t: calls for t in CALL_EVENTS}, types
    return elapsed, cpu


def raw_syncs(path: Path, n: int, size: int = 600) -> float:
    """write + fdatasync of one `size`-byte line, n times: what the disk allows."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    line = b"x" * (max(size, 1) - 1) + b"\n"
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            os.write(fd, line)
            os.fdatasync(fd)
        return n / (time.perf_counter() - t0)
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--appends", type=int, default=4000, help="appends per scenario (default 4000)")
    ap.add_argument("--calls", type=int, default=4000, help="gated calls per scenario (default 4000)")
    ap.add_argument("--verify-records", type=int, default=100_000)
    ap.add_argument("--dir", default=None,
                    help="where the logs are written (default: $TMPDIR); --dir /dev/shm: tmpfs, where syncs are free")
    args = ap.parse_args()
    key, sk = os.urandom(32), Ed25519PrivateKey.generate()
    with tempfile.TemporaryDirectory(prefix="vaultsim-bench-", dir=args.dir) as tmp:
        root = Path(tmp)
        print(f"disk baseline, write+fdatasync: {raw_syncs(root / 'raw', 500):10,.0f} /s  "
              "(the ceiling for one appender; 8 appenders can reach ~8x)")
        io1 = CountingIO()
        t = asyncio.run(appenders(root / "one.log", key, sk, 1, args.appends, io1))
        print(f"durable appends, 1 appender:   {args.appends / t:10,.0f} /s  "
              f"({io1.syncs} fdatasyncs for {args.appends} appends)")
        io8 = CountingIO()
        each = args.appends // 8
        t = asyncio.run(appenders(root / "eight.log", key, sk, 8, each, io8))
        print(f"durable appends, 8 appenders:  {8 * each / t:10,.0f} /s  "
              f"({io8.syncs} fdatasyncs for {8 * each} appends)")
        for agents in (1, 8, 32):
            io = CountingIO()
            each = args.calls // agents
            t, cpu = asyncio.run(gated_calls(root / f"calls-{agents}", agents, each, io))
            label = f"durable gated calls, {agents} agent{'s' if agents > 1 else ''}:"
            print(f"{label:<31}{agents * each / t:10,.0f} /s  "
                  f"({io.syncs} fdatasyncs for {agents * each} calls, CPU {cpu / (agents * each) * 1e6:.0f} us "
                  "per call; in-process, stub executor)")
            if agents == 8:
                print("  target: 8 agents >= 8,000 /s (default durability)")
                # agents that make one call at a time have at most one durable record each
                # waiting, so one fdatasync covers at most `agents` calls (one durable point each)
                batch = io.bytes // max(io.syncs, 1)
                sync_s = 1 / raw_syncs(root / "batch", 300, batch)
                print(f"  ceiling for 8 agents on this disk: {agents / sync_s:10,.0f} /s  (8 calls per "
                      f"fdatasync; write+fdatasync of one {batch:,}-byte batch, {sync_s * 1000:.3f} ms, "
                      "with no CPU spent on the calls)")
                # the same calls with no disk at all, each sync replaced by a sleep as long:
                # separates this disk from what the host charges for idling between rounds
                sleep = SleepIO(sync_s)
                t, cpu = asyncio.run(gated_calls(root / "calls-sleep", agents, each, sleep))
                print(f"  8 agents, each sync a sleep instead: {agents * each / t:8,.0f} /s  (no disk; slept "
                      f"{sleep.slept / max(sleep.syncs, 1) * 1000:.3f} ms each, CPU "
                      f"{cpu / (agents * each) * 1e6:.0f} us per call)")
                strict = CountingIO()
                t, cpu = asyncio.run(gated_calls(root / "calls-strict", agents, each, strict, durability="strict"))
                print(f"  8 agents, --durability strict:       {agents * each / t:8,.0f} /s  ({strict.syncs} "
                      f"fdatasyncs for {agents * each} calls, CPU {cpu / (agents * each) * 1e6:.0f} us per call; "
                      "the result synced before the answer too)")
        big = root / "audit.log"
        asyncio.run(bulk(big, key, sk, args.verify_records))
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            report = verify(big)
            best = min(best, time.perf_counter() - t0)
        assert report.intact and report.records == args.verify_records, report
        size = big.stat().st_size / 1e6
        print(f"offline verify:                {args.verify_records / best:10,.0f} records/s  "
              f"({args.verify_records:,} records, {size:.1f} MB, best of 3: {best * 1000:.0f} ms; "
              "target >= 400,000)")


if __name__ == "__main__":
    main()
