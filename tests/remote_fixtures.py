"""Fixtures for the fake remote and HTTP executor tests (imported explicitly).

A `Harness` is one RemoteServer on the test's event loop plus an HttpExecutor
configured the way the daemon will configure it, and every surface a secret
could leak to: the Result JSON, the event log (file and memory), the executor's
diagnostic, the same diagnostic recorded and shown through `vault.daemon.diagnostics`,
and the captured logs. Every credential contains the canary, so one substring
search covers them all. Nothing sleeps: waits poll with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from vault.catalog import Catalog, load_catalog
from vault.daemon.diagnostics import Diagnostics
from vault.cli.diag import render
from vault.executors.base import CallContext, ExecOutcome, ServiceConfig
from vault.executors.http import HttpExecutor
from vault.ids import correlation_id
from vault.remote import FaultSpec, RemoteServer
from vault.store.secret import Secret

# a list operation the client takes the first of (for duplicated/reordered items)
EXTRA = Catalog.model_validate({"operations": {"latest_build": {
    "description": "The newest build of a ref.", "risk": "read", "executor": "http",
    "service": "builds", "method": "GET", "path": "/v1/builds", "credential": "builds_token",
    "params": {"ref": {"type": "string"}}, "contract": "build_list",
}}})
CATALOG = load_catalog().merged(EXTRA)
TOKENS = ("tracker_token", "releases_token", "builds_token", "deploy_token", "records_token")


def make_canary() -> str:
    return "CANARY-" + secrets.token_hex(12)


@dataclass
class Call:
    outcome: ExecOutcome
    ctx: CallContext

    @property
    def result(self):  # noqa: ANN201 - the Result
        return self.outcome.result

    @property
    def cid(self) -> str:
        return self.ctx.correlation_id


class Harness:
    def __init__(self, remote: RemoteServer, executor: HttpExecutor, credentials: dict[str, str],
                 canary: str, diagnostics: Diagnostics, events_path: Path) -> None:
        self.remote = remote
        self.executor = executor
        self.credentials = credentials
        self.canary = canary
        self.diagnostics = diagnostics
        self.events_path = events_path

    def service(self, **options: Any) -> ServiceConfig:
        return ServiceConfig(name="remote", url=self.remote.service_url, options=options)

    async def call(self, op_name: str, params: dict[str, Any], *, deadline_s: float = 3.0,
                   key: str | None = None, **options: Any) -> Call:
        op = CATALOG.get(op_name)
        assert op is not None
        ctx = CallContext(correlation_id=correlation_id(), session_id="s-test", idempotency_key=key,
                          deadline=time.monotonic() + deadline_s)
        outcome = await self.executor.execute(op, op.validate_params(params),
                                              Secret(self.credentials[op.credential]),
                                              self.service(**options), ctx)
        return Call(outcome, ctx)

    async def lookup(self, op_name: str, *, cid: str | None = None, key: str | None = None,
                     deadline_s: float = 3.0) -> ExecOutcome:
        op = CATALOG.get(op_name)
        assert op is not None
        ctx = CallContext(correlation_id=correlation_id(), session_id="s-test",
                          deadline=time.monotonic() + deadline_s)
        return await self.executor.lookup(op, Secret(self.credentials[op.credential]), self.service(),
                                          ctx, correlation_id=cid, idempotency_key=key)

    def events(self, cid: str) -> list[dict[str, Any]]:
        return self.remote.events.snapshot(cid)

    async def wait_event(self, cid: str, name: str, timeout: float = 5.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            found = [e for e in self.events(cid) if e["event"] == name]
            if found:
                return found[-1]
            assert time.monotonic() < deadline, f"no {name} event for {cid}: {self.events(cid)}"
            await asyncio.sleep(0.01)

    def leak_surfaces(self, *outcomes: ExecOutcome, logs: str = "") -> dict[str, str]:
        """Every text a secret must never reach, by name."""
        surfaces = {
            "event_file": self.events_path.read_text() if self.events_path.exists() else "",
            "event_memory": json.dumps(self.remote.events.snapshot()),
            "ledger": json.dumps(self.remote.ledger.snapshot()),
            "logs": logs,
        }
        for i, outcome in enumerate(outcomes):
            surfaces[f"result{i}"] = outcome.result.to_json()
            surfaces[f"diagnostic{i}"] = json.dumps(outcome.diagnostic)
            if outcome.diagnostic is not None:
                did = self.diagnostics.record(outcome.diagnostic)
                surfaces[f"diag_file{i}"] = (self.diagnostics.directory / f"{did}.diag").read_bytes().decode("latin-1")
                surfaces[f"diag_shown{i}"] = render(self.diagnostics.load(did))
        return surfaces

    def assert_no_leak(self, *outcomes: ExecOutcome, logs: str = "") -> None:
        leaked = [name for name, text in self.leak_surfaces(*outcomes, logs=logs).items()
                  if self.canary in text]
        assert leaked == [], f"canary found in {leaked}"


@pytest.fixture
def canary() -> str:
    return make_canary()


@pytest.fixture
def credentials(canary: str) -> dict[str, str]:
    return {name: f"{canary}-{name}" for name in TOKENS}


@pytest.fixture
def diagnostics(tmp_path: Path) -> Diagnostics:
    return Diagnostics(tmp_path / "diagnostics", os.urandom(32))


@pytest.fixture
async def harness_factory(tmp_path: Path, credentials: dict[str, str], canary: str,
                          diagnostics: Diagnostics) -> AsyncIterator[Callable[..., Awaitable[Harness]]]:
    made: list[Harness] = []

    async def make(fault: str | FaultSpec | None = None) -> Harness:
        spec = FaultSpec.parse(fault) if isinstance(fault, str) else fault
        events_path = tmp_path / f"events-{len(made)}.jsonl"
        remote = RemoteServer(credentials, spec, events_path)
        await remote.start()
        harness = Harness(remote, HttpExecutor(), credentials, canary, diagnostics, events_path)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        await harness.executor.aclose()
        await harness.remote.stop()
