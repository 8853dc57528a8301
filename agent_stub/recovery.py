"""The two recovery policies: what the stub does after each Result.

`safe` follows the retry instruction it is given:

    success            next step
    outcome_unknown    reconcile first: `lookup` (polling while the remote is
                       still working); found -> the step is done, never resent;
                       not_found -> resend with the same idempotency key
                       (bounded); still unknown -> stop, a person must look
    local_failure,     resend with the same key, at most `max_retries` times
    confirmed_failure
    rate_limited       wait `retry_after_s`, then resend, if that fits before
                       the deadline's reserve; else stop and say so
    approval_pending   write a decision receipt (owner, deadline, resume
                       token) and report the wait; a restarted process resumes
    anything else      stop (never / after_unlock / human_required)

It keeps `reserve_s` before the task deadline: no ordinary step starts inside
the reserve and approval waits are cut short to leave it; only `verify` steps
may use it.

`naive` is the agent the gate exists to catch: it resends any failure with a
fresh idempotency key, ignores every retry instruction and the deadline,
persists nothing, and claims completion whatever happened.
"""

from __future__ import annotations

import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from vault.client import AgentClient
from vault.errors import RpcError
from vault.models import Category, Result

from agent_stub.plan import Plan, Step, resolve
from agent_stub.receipts import Receipts, step_id
from agent_stub.task import Task

_ADVICE = {
    Category.authentication_failed: "the credential was rejected; a person must recover it",
    Category.authorization_denied: "this operation is not allowed for this agent",
    Category.malformed_response: "the remote's answer broke its contract; reporting the mismatch",
    Category.approval_denied: "a person declined; not asking again",
    Category.approval_expired: "nobody decided before the deadline",
    Category.approval_unroutable: "no approver can receive the request; a person is needed",
    Category.vault_locked: "the vault is locked; waiting for someone to unlock it",
    Category.outcome_unknown: "the remote outcome is still unknown; a person must inspect it",
    Category.rate_limited: "rate limited and no time left to wait before the deadline",
    Category.local_failure: "failed repeatedly before reaching the remote",
    Category.confirmed_failure: "the remote refused the work repeatedly",
}


def emit(result: Result) -> None:
    sys.stdout.write(result.to_json() + "\n")
    sys.stdout.flush()


@dataclass
class Agent:
    """What a policy works with: the session, the plan, the task and its memory."""

    client: AgentClient
    socket_path: str
    plan: Plan
    task: Task
    name: str
    run_id: str | None
    receipts: Receipts
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def key(self, index: int, step: Step) -> str | None:
        if step.idempotency_key == "auto" or step.idempotency_key is None:
            # stable across restarts: the same run, agent and step (position, operation,
            # parameters) give the same key; another step never shares it
            digest = step_id(index, step.call, step.params).rsplit(":", 1)[1]
            return f"{self.run_id or 'run'}-{self.name}-{index}-{digest}"
        return step.idempotency_key

    def remember(self, index: int, step: Step, data: dict[str, Any]) -> None:
        self.results[step.id or f"s{index}"] = data
        self.receipts.finished(step_id(index, step.call, step.params), data)

    def call(self, step: Step, key: str | None, wait_s: float | None) -> Result:
        params = resolve(step.params, self.results)
        result = self.client.call(step.call, params, idempotency_key=key, wait_s=wait_s)
        emit(result)
        return result

def _data_of(result: Result) -> dict[str, Any]:
    """Result data in a shape later steps can reference (`${step.id}`)."""
    data = dict(result.data or {})
    created = data.get("created")
    if "id" not in data and isinstance(created, list) and created and isinstance(created[0], dict):
        data["id"] = created[0].get("id")
    return data


def _when(deadline: float | None) -> str:
    if deadline is None:
        return "no deadline"
    return datetime.fromtimestamp(deadline, tz=timezone.utc).isoformat(timespec="seconds")


class Safe:
    def __init__(self, agent: Agent) -> None:
        self.a = agent
        self.plan = agent.plan

    def run(self) -> str:
        finished: list[str] = []
        for index, step in enumerate(self.plan.steps):
            sid = step_id(index, step.call, step.params)
            if sid in self.a.receipts.done:  # finished before a restart
                self.a.results[step.id or f"s{index}"] = self.a.receipts.done[sid]
                finished.append(step.call)
                continue
            stop = self.step(index, step)
            if stop is not None:
                return stop
            finished.append(step.call)
        return self.plan.final or ("done: " + ", ".join(finished) if finished else "done: nothing to do")

    # -- time ------------------------------------------------------------------

    def budget(self, step: Step) -> float:
        """Seconds this step may use: the reserve is only for verification."""
        left = self.a.task.time_left()
        return left - (0.05 if step.verify else self.plan.reserve_s)

    def wait_for(self, step: Step) -> float | None:
        budget = self.budget(step)
        if budget == float("inf"):
            return step.wait_s
        return max(0.0, min(step.wait_s if step.wait_s is not None else budget, budget))

    # -- one step --------------------------------------------------------------

    def step(self, index: int, step: Step) -> str | None:
        """Run a step to a conclusion; a final message when the agent must stop."""
        if self.budget(step) <= 0:
            return (f"not done: stopped before {step.call}: the deadline is near and the time left is kept "
                    "for clean-up and verification")
        key = self.a.key(index, step)
        sid = step_id(index, step.call, step.params)
        receipt = self.a.receipts.pending.get(sid)
        result: Result | None = None
        if receipt is not None:
            try:
                result = self.a.client.resume(receipt["resume_token"], wait_s=self.wait_for(step))
                emit(result)
            except RpcError:
                self.a.receipts.dropped(sid)  # the vault no longer knows it: ask afresh
        try:
            if result is None:
                result = self.a.call(step, key, self.wait_for(step))
        except RpcError as exc:
            return f"not done: stopped at {step.call}: the vault rejected the request ({exc.message})"
        retries = 0
        while True:
            cat = result.category
            if cat is Category.success:
                self.a.remember(index, step, _data_of(result))
                return None
            if cat is Category.approval_pending:
                self.a.receipts.wait(sid, {
                    "operation": step.call, "request_id": result.request_id,
                    "correlation_id": result.correlation_id, "owner": result.owner,
                    "deadline": result.deadline, "resume_token": result.resume_token})
                return (f"waiting: {step.call} needs approval from {result.owner} before "
                        f"{_when(result.deadline)} (request {result.request_id}); resume token "
                        f"{result.resume_token}, also kept in the decision receipt")
            again = retries < self.plan.max_retries
            if cat is Category.outcome_unknown:
                if self.plan.reconcile == "same_key" and again and key:
                    retries += 1
                    result = self.a.call(step, key, self.wait_for(step))
                    continue
                found = self.reconcile(result)
                if found.reconciled == "found" and found.category is Category.success:
                    self.a.remember(index, step, _data_of(found))
                    return None
                if found.reconciled == "found":
                    return f"not done: stopped at {step.call}: it ran and failed ({found.category})"
                if found.reconciled == "not_found" and again:
                    retries += 1
                    result = self.a.call(step, key, self.wait_for(step))
                    continue
                return f"not done: stopped at {step.call}: {_ADVICE[Category.outcome_unknown]}"
            if cat in (Category.local_failure, Category.confirmed_failure) and again:
                retries += 1
                result = self.a.call(step, key, self.wait_for(step))
                continue
            if cat is Category.rate_limited and again:
                delay = result.retry_after_s if result.retry_after_s is not None else 1.0
                if delay < self.budget(step):
                    time.sleep(delay)  # the instruction is to wait, so the agent waits
                    retries += 1
                    result = self.a.call(step, key, self.wait_for(step))
                    continue
            advice = _ADVICE.get(cat, "stopping")
            return f"not done: stopped at {step.call}: {cat} (retry: {result.retry}); {advice}"

    def reconcile(self, unknown: Result) -> Result:
        """Ask the vault what became of an operation, polling while it is in progress."""
        last = unknown
        for n in range(self.plan.lookup_polls):
            if n:
                pause = min(0.1 * 2 ** (n - 1), self.a.task.time_left() - self.plan.reserve_s)
                if pause <= 0:
                    break
                time.sleep(pause)  # the remote said "still working": ask again shortly
            last = self.a.client.lookup(correlation_id=unknown.correlation_id, operation=unknown.operation)
            emit(last)
            if last.reconciled in ("found", "not_found"):
                break
        return last


class Naive:
    def __init__(self, agent: Agent) -> None:
        self.a = agent
        self.plan = agent.plan

    def run(self) -> str:
        for step in self.plan.steps:
            for _ in range(1 + self.plan.max_retries):
                try:
                    # a fresh key every time: each resend is a new operation to the remote
                    result = self.a.call(step, uuid.uuid4().hex, step.wait_s)
                except RpcError:
                    break
                if result.ok:
                    self.a.results[step.id or step.call] = _data_of(result)
                    break
        return self.plan.final or "done: all steps completed"


POLICIES: dict[str, type[Safe] | type[Naive]] = {"safe": Safe, "naive": Naive}
