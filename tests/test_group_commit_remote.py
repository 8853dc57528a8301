"""A call waiting on its remote does not push another call's fdatasync into the flush thread.

The audit writer syncs a flush in the loop thread when every call in progress
waits for it, and hands it to its flush thread otherwise, so that other work
gets the loop meanwhile. A call whose executor is waiting on the remote's
answer appends nothing before that answer arrives: counting it sent nearly
every flush to the thread at 8 agents (some are always mid-HTTP), and the
hand-off was the largest single item of the daemon's CPU. Here a real daemon
(assembled as `vaultsim daemon` does, never serving sockets) holds one call at
its executor while another runs, and the syncs are watched by thread.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from audit_fixtures import FlakyIO

from vault.audit import decrypt_events, verify
from vault.audit.adapter import open_audit
from vault.catalog import Operation
from vault.config import load_config
from vault.daemon.daemon import VaultDaemon
from vault.daemon.peer import ProcessIdentity
from vault.executors.base import CallContext, ExecOutcome, Executor, ServiceConfig
from vault.home import VaultHome
from vault.models import Category, make_result
from vault.store.credentials import CredentialStore
from vault.store.keyring_backend import FileKeyring
from vault.store.keystore import KeyStore
from vault.store.secret import Secret


class HeldRemote(Executor):
    """Answers at once, except for issue HELD, which waits until released."""

    kind = "http"

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def execute(self, op: Operation, params: dict[str, Any], credential: Secret,
                      service: ServiceConfig, ctx: CallContext) -> ExecOutcome:
        if params.get("issue_id") == "HELD":
            self.entered.set()
            await self.release.wait()
        return ExecOutcome(make_result(Category.success, op.name, ctx.correlation_id, "Done."), None, True)


async def test_a_call_at_the_remote_leaves_the_next_sync_in_the_loop(tmp_path: Path) -> None:
    home = VaultHome(tmp_path / "home").ensure()
    keystore = KeyStore(home, backend=FileKeyring(tmp_path / "keyring"))
    store = CredentialStore(home, keystore)
    store.set("tracker_token", "group-commit-token")
    config = load_config(None, remote_url="http://127.0.0.1:9")  # nothing dials it
    io, remote = FlakyIO(), HeldRemote()
    key = keystore.derive("audit")
    writer = open_audit(home, key, io=io)
    daemon = VaultDaemon(home, config, unlocked=True, keyring_backend=keystore.backend_name(),
                         store=store, audit=writer, executors={"http": remote})
    op = daemon.catalog.get("read_issue")
    assert op is not None
    me = ProcessIdentity.of(os.getpid(), os.getuid())
    assert me is not None
    held_s, other_s = (daemon.sessions.open(f"agent-{i}", "run", me, f"conn-{i}") for i in range(2))

    held = asyncio.create_task(daemon.calls.call(held_s, op, {"issue_id": "HELD"}, None, None))
    await asyncio.wait_for(remote.entered.wait(), 10)
    before = len(io.sync_threads)
    for _ in range(3):
        result = await daemon.calls.call(other_s, op, {"issue_id": "ISS-1"}, None, None)
        assert result.category is Category.success
    during = io.synced_in_loop_thread()[before:]
    # each of those calls synced its intent while the held call waited on its remote, and
    # all in the loop thread: the held call was not counted as needing the loop
    assert during and all(during), during
    assert not held.done()
    remote.release.set()
    assert (await asyncio.wait_for(held, 10)).category is Category.success
    writer.close()
    report = verify(home.audit_log)
    assert report.intact, report
    intents = [e for e in decrypt_events(home.audit_log, key) if e["type"] == "intent"]
    assert 4 == len(intents)
