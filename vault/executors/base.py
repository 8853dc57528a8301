"""The executor plug-in interface."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from vault.catalog import Operation
from vault.models import Category, Result, make_result
from vault.store.secret import Secret


@dataclass(frozen=True)
class ServiceConfig:
    """Where a service lives. http: `url`; ssh: host, port, user, known_hosts."""

    name: str
    url: str | None = None
    host: str | None = None
    port: int | None = None
    user: str | None = None
    known_hosts: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CallContext:
    correlation_id: str
    session_id: str
    idempotency_key: str | None = None
    run_id: str | None = None
    # absolute time.monotonic() after which the call must give up
    deadline: float | None = None
    # private scratch directory (0700) for the executor, e.g. ssh key files
    workdir: str | None = None
    # the caller asked `op.refusal` of these very params (and nothing changes them): the
    # executor need not ask again (the daemon's calls; anyone else's are checked there)
    params_checked: bool = False


@dataclass
class ExecOutcome:
    result: Result
    # raw status, headers (Authorization redacted), body: protected diagnostics only
    diagnostic: dict[str, Any] | None = None
    # did any byte of the request leave this process? (audit + classification)
    remote_touched: bool = False


class Executor(abc.ABC):
    kind: str = ""

    @abc.abstractmethod
    async def execute(
        self, op: Operation, params: dict[str, Any], credential: Secret,
        service: ServiceConfig, ctx: CallContext,
    ) -> ExecOutcome: ...

    async def lookup(
        self, op: Operation, credential: Secret, service: ServiceConfig,
        ctx: CallContext, *, correlation_id: str | None, idempotency_key: str | None,
    ) -> ExecOutcome:
        """Reconcile an earlier operation against the remote; default: cannot know."""
        return ExecOutcome(make_result(
            Category.success, op.name, ctx.correlation_id,
            "this operation has no way to look up earlier attempts; its effect is unknown",
            reconciled="unknown",
        ))

    async def aclose(self) -> None:
        return None
