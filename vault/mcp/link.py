"""One vault session per MCP session, and waiting for a person in a way that fits the host.

MCP hosts give a tool call 60 s or less, and people take longer. So a call
that needs an approval never blocks blindly:

    1. `call` with wait_s=0: an allowed or auto call runs at once; one that needs a
       person comes back approval_pending with its resume token, so the bridge
       holds the token from the start
    2. `call.resume` waits for the decision, at most the wait budget (default 50 s,
       under the hosts' 60 s); meanwhile a progress notification goes out every
       few seconds (hosts that reset their timeout on progress keep waiting)
    3. decided in time: the operation's Result. Not yet: approval_pending with the
       resume token and deadline, so a host with a hard timeout always gets one
    4. the host cancels the call (notifications/cancelled): held back for a grace, in
       which the host's retry of the identical call joins the request (vault.mcp.rejoin);
       at its end, or when the MCP session ends while the bridge still waits,
       `call.cancel` withdraws the request at the vault; the approver's row goes away and
       it never runs. A cancel that comes after
       the person allowed it withdraws nothing: the call runs, so the cancel is ignored
       (`cannot_cancel`, checked by the transports before the SDK hears of it) and the
       host gets its Result
    5. the host ends its MCP session with the call still waiting (stdin closed, or an
       HTTP DELETE: `end_waits`): withdrawn as in 4, and the host is answered the
       vault's Result for it (withdrawn, or what ran if the person allowed it just
       before), not a bare "connection closed" or nothing at all. Unless the bridge has
       already answered its resume token to the host, on this MCP session or another
       (`HandedTokens`): that wait is the host's to hand over, so it is left to the person
       and the call answered approval_pending

Calls on one link run concurrently (the daemon answers each request on its
connection in its own task). The link opens its vault session lazily and opens
a new one if the daemon restarted (a restarted daemon remembers no grant).
Every failure is answered as a Result, never as an exception or a bare error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import anyio
from pydantic import ValidationError

from vault.client import AsyncRpcClient, DaemonSilent
from vault.silence import answer_within
from vault.errors import HomeError, RpcError, VaultError
from vault.ids import correlation_id, scope
from vault.jsonrpc import INVALID_PARAMS, LIMIT
from vault.models import Category, Result, make_result
from vault.daemon.sessions import ClientLabel
from vault.mcp.rejoin import Waits, fingerprint

log = logging.getLogger("vaultsim.mcp")

Progress = Callable[[float, str], Awaitable[None]]  # (seconds waited so far, what for)

# how long withdrawing a request may hold up a cancelled call or a closing session
_WITHDRAW_WITHIN_S = 5.0


async def no_progress(elapsed: float, message: str) -> None:
    return None


@dataclass(frozen=True)
class WaitPolicy:
    budget_s: float = 50.0  # a tool call answers within this, pending or not
    progress_every_s: float = 5.0
    until: float | None = None  # epoch seconds: no call waits past this (a task's deadline, less a margin)
    cancel_grace_s: float = 15.0  # a host's cancel of a waiting call takes effect after this (vault.mcp.rejoin)


class HandedTokens:
    """Resume tokens the bridge has answered to a host, on any of its MCP sessions. Ending a session
    withdraws only the waits whose token its host was never given: a URL host whose POST was cut,
    and which got the token from vault_lookup on a new session, may hand that wait over and end."""

    _CAP = 4096  # oldest forgotten first; a forgotten token's wait is withdrawn as before

    def __init__(self) -> None:
        self._tokens: dict[str, None] = {}

    def add(self, token: str) -> None:
        self._tokens.pop(token, None)
        self._tokens[token] = None
        while len(self._tokens) > self._CAP:
            del self._tokens[next(iter(self._tokens))]

    def __contains__(self, token: object) -> bool:
        return token in self._tokens


class _NoDaemon(Exception):
    """Nothing answers on the agent socket: nothing was sent."""


class _NotOpened(Exception):
    """The daemon answered but opened no vault session: nothing was sent."""


class VaultLink:
    """A vault session on its own agent-socket connection, for one MCP session."""

    def __init__(self, socket_path: str, agent: str, run_id: str | None, label: ClientLabel | None,
                 policy: WaitPolicy, handed: HandedTokens | None = None) -> None:
        self.socket_path, self.agent, self.run_id, self.label = socket_path, agent, run_id, label
        self.policy = policy
        self.handed = handed if handed is not None else HandedTokens()
        self.session_id: str | None = None
        self._client: AsyncRpcClient | None = None
        self._lock = asyncio.Lock()
        self._inflight: set[str] = set()  # resume tokens waited on here, not yet handed to the host
        self._waiting: dict[str, str] = {}  # the host's request (its JSON-RPC id, as JSON) -> its resume token
        self._waits = Waits()  # who waits on each token, and the one call.resume in flight for it
        self._dropped: set[str] = set()  # the host's requests it cancelled, answered all the same
        self._starting: set[str] = set()  # the host's requests whose first answer has not come yet
        self._cancel_asked: set[str] = set()  # ... of those, the ones the host cancelled meanwhile
        self._background: set[asyncio.Task[Any]] = set()
        self._ending = asyncio.Event()  # the host is leaving: answer waits now, do not start any
        self.closed = False

    # ---- the vault session ---------------------------------------------------------

    async def open(self, within_s: float | None = None) -> str:
        async with self._lock:
            if self.closed:
                raise _NoDaemon("this MCP session has ended")
            # a connection whose daemon stopped mid-line and since ended it is kept, and with it the
            # session and its grants (section 3: they last while this process does); one still cut
            # is unreadable: a new one, a new session, no grant (vault.client.AsyncRpcClient.unusable)
            if self._client is not None and not self._client.unusable():
                return self.session_id  # type: ignore[return-value]
            if self._client is not None:
                await self._client.close()
                self._client, self.session_id = None, None
            try:
                client = await AsyncRpcClient.connect(self.socket_path)
            except (HomeError, OSError):
                raise _NoDaemon(f"no vaultsim daemon answers on {self.socket_path}") from None
            try:
                params: dict[str, Any] = {"agent": self.agent}
                if self.run_id:
                    params["run_id"] = self.run_id
                if self.label is not None:
                    params["client"] = self.label.model_dump(exclude_none=True)
                opened = await client.request_within(within_s, "session.open", **params)
            except DaemonSilent as exc:
                await client.close()
                raise _NotOpened(f"{exc.message}; nothing was sent") from None
            except (HomeError, OSError):
                # accepted, then closed: the daemon refuses a connection past its caps (e.g. 256
                # a process: one HTTP bridge serving that many MCP sessions) or is stopping
                await client.close()
                raise _NotOpened("the vault closed the connection before opening a session (a "
                                 "connection limit reached, or the daemon stopping)") from None
            except BaseException:
                await client.close()
                raise
            self._client, self.session_id = client, str(opened["session_id"])
            return self.session_id

    async def _request(self, within_s: float, method: str, **params: Any) -> Any:
        await self.open(within_s)
        assert self._client is not None
        return await self._client.request_within(within_s, method, session_id=self.session_id, **params)

    def _answer_within(self, method: str, args: dict[str, Any]) -> float:
        """How long the daemon has to answer a request before the host is told it is silent
        (vault.silence: every client's rule): a resume's wait_s; a call's remote work, or its wait
        budget if longer; plus a little, and never much past the task's `until`."""
        wait = float(args.get("wait_s") or 0.0) if method == "call.resume" else self.policy.budget_s
        within = answer_within("call.resume" if method == "call.resume" else "call", wait, self.policy.until)
        assert within is not None  # a wait was given
        return within

    async def close(self) -> None:
        """End the vault session: withdraw what the host never got a token for, then close."""
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(_WITHDRAW_WITHIN_S):
            for token in list(self._inflight):
                if token not in self.handed:  # a host holding the token may have handed the wait over
                    await self._withdraw_now(token)
            if self._background:
                await asyncio.wait(set(self._background), timeout=_WITHDRAW_WITHIN_S)
            async with self._lock:  # a session.open in flight finishes first, then is closed
                client, self._client = self._client, None
            if client is not None:
                if not client.closed.is_set() and self.session_id:
                    try:
                        await client.request_within(_WITHDRAW_WITHIN_S, "session.close",
                                                    session_id=self.session_id)
                    except (VaultError, OSError):
                        pass  # the daemon ends the session with the connection anyway
                await client.close()

    def end_waits(self) -> None:
        """The host is ending the MCP session: each call waiting for a person is withdrawn and answered
        now (see step 5 of the module doc), so the host's last answers are Results."""
        self._ending.set()

    # ---- calls ---------------------------------------------------------------------

    async def call(self, operation: str, params: dict[str, Any], idempotency_key: str | None,
                   wait_s: float | None, mutates: bool, progress: Progress = no_progress,
                   request_key: str | None = None) -> Result:
        started = time.monotonic()
        fp = fingerprint(operation, params, idempotency_key or None)
        joined = self._waits.joinable(fp, started)
        if joined is not None:
            # the identical call, whose host cancelled it within the grace: the same request, not a
            # second prompt (vault.mcp.rejoin)
            log.info("a retry of %s joined its cancelled call (request %s)", operation, joined.request_id)
            return await self._settle(joined, started, self._budget(wait_s), mutates, progress, request_key, fp)
        args: dict[str, Any] = {"operation": operation, "params": params, "wait_s": 0}
        if idempotency_key:
            args["idempotency_key"] = idempotency_key
        first = await self._starting_with(request_key, self._first("call", args, operation, mutates))
        return await self._settle(first, started, self._budget(wait_s), mutates, progress, request_key, fp)

    async def resume(self, resume_token: str, wait_s: float | None, mutates: bool,
                     progress: Progress = no_progress, request_key: str | None = None) -> Result:
        started = time.monotonic()
        first = await self._starting_with(request_key, self._first(
            "call.resume", {"resume_token": resume_token, "wait_s": 0}, "call.resume", mutates))
        return await self._settle(first, started, self._budget(wait_s), mutates, progress, request_key)

    async def _starting_with(self, request_key: str | None, first: Awaitable[Result]) -> Result:
        if request_key is None:
            return await first
        self._starting.add(request_key)
        try:
            return await first
        except BaseException:
            self._cancel_asked.discard(request_key)
            raise
        finally:
            self._starting.discard(request_key)

    async def cannot_cancel(self, request_key: str) -> bool:
        """The host cancels request `request_key`: withdraw its call at the vault if it waits for a
        person. True when that is too late (the person allowed it and it runs): the cancel is then
        ignored, as MCP lets a receiver ignore one for a request that cannot be cancelled, and the
        host is answered with what the call did (it was answered nothing, or over HTTP -32800
        "Request cancelled", for a deployment that ran)."""
        if request_key in self._starting:
            # its first answer is still coming: a call that runs already (auto, a grant, or allowed
            # at once) cannot be stopped, and one that waits is withdrawn as soon as it says so
            # (_settle); either way the host is answered with its Result
            self._cancel_asked.add(request_key)
            return True
        token = self._waiting.get(request_key)
        if token is None:
            return False  # nothing in flight at the vault under it: cancelled as before
        if self.policy.cancel_grace_s > 0 and not self._ending.is_set():
            # held back: the request keeps its place for the grace, so the host's retry joins it
            # (vault.mcp.rejoin); this request is answered, as a cancel MCP lets us ignore is
            self._waits.drop(token, request_key, time.monotonic() + self.policy.cancel_grace_s)
            self._dropped.add(request_key)
            return True
        out = None
        with anyio.move_on_after(_WITHDRAW_WITHIN_S):  # the host's input waits on this: bounded
            out = await self._withdraw_now(token)
        return out is not None and out.get("state") == "allowed" and not out.get("withdrawn")

    def host_dropped(self, request_key: str | None) -> bool:
        """Whether the host cancelled this (now answered) request: a token in its answer never
        reached the host, so it is not the host's to hand over (HandedTokens)."""
        if request_key is None or request_key not in self._dropped:
            return False
        self._dropped.discard(request_key)
        return True

    def deferred(self, request_key: str) -> bool:
        """The host cancelled this request and its cancel is held back for the grace."""
        token = self._waiting.get(request_key)
        return token is not None and self._waits.dropped_until(token, request_key) is not None

    async def lookup(self, correlation_id: str | None, idempotency_key: str | None,
                     operation: str | None) -> Result:
        args = {k: v for k, v in (("correlation_id", correlation_id), ("idempotency_key", idempotency_key),
                                  ("operation", operation)) if v}
        return await self._result_of("lookup", args, operation or "lookup", mutates=False)

    def _budget(self, wait_s: float | None) -> float:
        budget = self.policy.budget_s if wait_s is None else max(0.0, min(wait_s, self.policy.budget_s))
        if self.policy.until is not None:
            budget = min(budget, max(0.0, self.policy.until - time.time()))
        return budget

    async def _first(self, method: str, args: dict[str, Any], operation: str, mutates: bool) -> Result:
        """The first answer, kept even if the host cancels meanwhile: if it turns out to be a
        pending approval, it is withdrawn rather than left for someone to approve."""
        task = asyncio.ensure_future(self._result_of(method, args, operation, mutates))
        self._keep(task)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._withdraw_if_pending)
            raise

    async def _settle(self, result: Result, started: float, budget_s: float, mutates: bool,
                      progress: Progress, request_key: str | None = None, fp: str | None = None) -> Result:
        """Wait for the person's decision within the budget, telling the host we are alive."""
        token = result.resume_token
        cancelled = request_key is not None and request_key in self._cancel_asked
        self._cancel_asked.discard(request_key or "")
        if result.category is not Category.approval_pending or not token:
            return result
        if cancelled:  # the host cancelled before the vault said it waits: withdrawn, and told so
            return await self._withdrawn(token, result, mutates)
        end = started + budget_s
        held = result  # the request's own approval_pending: its token is the host's way back to it
        me: object = request_key if request_key is not None else object()
        woken = self._waits.hold(token, me, held, fp)
        self._inflight.add(token)
        if request_key is not None:
            self._waiting[request_key] = token
        try:
            while True:
                grace = self._waits.dropped_until(token, me)
                if grace is not None:  # its host cancelled it: it keeps its place until the grace ends
                    end = grace if self.policy.until is None else min(
                        grace, time.monotonic() + max(0.0, self.policy.until - time.time()))
                if (left := end - time.monotonic()) <= 0:
                    break
                if self._ending.is_set():
                    return await self._leaving(token, held, mutates)
                waiter = self._waits.waiter(token, lambda: self._result_of(
                    "call.resume", {"resume_token": token, "wait_s": left}, result.operation, mutates))
                ending = asyncio.ensure_future(self._ending.wait())
                cancel = asyncio.ensure_future(woken.wait())
                watched: set[asyncio.Future[Any]] = {waiter, ending, cancel}
                try:
                    while not waiter.done() and not ending.done() and not cancel.done():
                        await asyncio.wait(watched, timeout=min(self.policy.progress_every_s, left),
                                           return_when=asyncio.FIRST_COMPLETED)
                        if (left := end - time.monotonic()) <= 0:
                            break
                        if not waiter.done() and not ending.done() and not cancel.done():
                            await progress(time.monotonic() - started, _waiting_words(result))
                finally:
                    ending.cancel()
                    cancel.cancel()
                if cancel.done() and not waiter.done():
                    woken.clear()
                    continue  # the host cancelled it: the loop's end is now its grace's
                if not waiter.done():
                    if self._ending.is_set():  # the host is leaving while the person has not decided
                        return await self._leaving(token, held, mutates)
                    break  # its time is up
                got = waiter.result()
                if got.category is Category.rate_limited and got.correlation_id != held.correlation_id:
                    # the vault refused the resume itself (64 requests already in flight on this
                    # session's connection), not the request: it still waits for the person. Handing
                    # this on lost the token: the host resent (a second prompt) and the first stayed
                    # on the person's screen with nobody to collect it. Try again within the budget;
                    # at its end the host gets the request's own approval_pending, token and all
                    await asyncio.sleep(max(0.0, min(got.retry_after_s or 1.0, end - time.monotonic())))
                    continue
                result = got
                if result.category is not Category.approval_pending:
                    if self._waits.dropped_until(token, me) is not None and not result.category.value.startswith(
                            "approval_"):
                        log.warning("a cancel of %s came after the person allowed it, or within its grace: it ran, "
                                    "and the cancelled call is answered with its Result (vault_lookup with "
                                    "correlation_id %s, or its idempotency_key, gives it too)",
                                    held.operation, held.correlation_id)
                    return result
            if self._waits.dropped_until(token, me) is not None and not self._waits.others(token, me):
                # its host cancelled it and no retry came within the grace: withdrawn, as it asked
                return await self._withdrawn(token, held, mutates)
            return result  # still pending: the host gets the token and the deadline
        except asyncio.CancelledError:
            if token in self.handed or self._waits.others(token, me):
                # not the host's cancel (cannot_cancel withdrew that already): the bridge is
                # stopping, and the host holds this token (or another of its requests waits on it),
                # so the wait is left to the person
                raise
            with anyio.CancelScope(shield=True), anyio.move_on_after(_WITHDRAW_WITHIN_S):
                out = await self._withdraw_now(token)
                if out is not None and out.get("state") == "allowed" and not out.get("withdrawn"):
                    # too late: the person allowed it and it runs. The host gets no answer (MCP:
                    # a cancelled request is not answered), so say where its outcome is found
                    log.warning("a cancelled %s could not be withdrawn (request %s was %s): it runs, and "
                                "vault_lookup with correlation_id %s (or its idempotency_key) gives its outcome",
                                held.operation, out.get("request_id"), out.get("state"), held.correlation_id)
            raise
        finally:
            if self._waits.release(token, me):
                self._inflight.discard(token)
            if request_key is not None and self._waiting.get(request_key) == token:
                del self._waiting[request_key]

    def _own_id(self) -> str:
        """A correlation id for an answer the bridge makes itself, ending as the daemon's ids of
        this agent and run do: a host looking it up asks about its own call, never a made-up one
        (a lookup of an id no call of its agent and run can have is graded: vault.runner.foreign_refs)."""
        return correlation_id() + scope(self.run_id, self.agent)

    async def _result_of(self, method: str, args: dict[str, Any], operation: str, mutates: bool) -> Result:
        """The daemon's answer as a Result, whatever happened on the way."""
        within = self._answer_within(method, args)
        try:
            await self.open(within)
        except _NoDaemon as exc:
            return make_result(Category.local_failure, operation, self._own_id(),
                               f"{exc}; nothing was sent. Start one (vaultsim daemon) or check VAULTSIM_HOME")
        except (RpcError, _NotOpened) as exc:  # no session opened (a limit, a bad run id)
            why = exc.message if isinstance(exc, RpcError) else str(exc)
            return make_result(Category.local_failure, operation, self._own_id(),
                               f"the vault did not open a session: {why}; nothing was sent")
        try:
            return Result.model_validate(await self._request(within, method, **args))
        except RpcError as exc:
            return _refused(operation, exc, self._own_id())
        except DaemonSilent as exc:
            # sent, and not answered: stopped or stuck, and a change may or may not have happened
            if mutates:
                how = ("with the correlation_id of the approval_pending Result (or your idempotency_key)"
                       if operation == "call.resume" else f"with operation {operation!r} and your idempotency_key")
                return make_result(Category.outcome_unknown, operation, self._own_id(),
                                   f"{exc.message}; the operation may have run. Use vault_lookup {how} "
                                   "before any retry")
            return make_result(Category.local_failure, operation, self._own_id(),
                               f"{exc.message}; nothing changed. Try again")
        except (HomeError, OSError, _NoDaemon):
            # sent, and then the daemon went away: a change may or may not have happened
            if mutates and method == "call.resume" and operation == "call.resume":
                # the operation is not known here, and vault_lookup takes no "call.resume"
                return make_result(Category.outcome_unknown, operation, self._own_id(),
                                   "the vault daemon went away while this resume was in flight; the operation "
                                   "may have run. Use vault_lookup with the correlation_id of the "
                                   "approval_pending Result (or your idempotency_key) before any retry")
            if mutates:
                return make_result(Category.outcome_unknown, operation, self._own_id(),
                                   "the vault daemon went away while this call was in flight; it may have run. "
                                   f"Use vault_lookup with operation {operation!r} and your idempotency_key "
                                   "before any retry")
            return make_result(Category.local_failure, operation, self._own_id(),
                               "the vault daemon went away while this call was in flight; nothing changed")
        except ValidationError:
            return make_result(Category.outcome_unknown if mutates else Category.malformed_response, operation,
                               self._own_id(), "the vault answered something that is not a Result")

    # ---- withdrawing ---------------------------------------------------------------

    async def _leaving(self, token: str, held: Result, mutates: bool) -> Result:
        """The MCP session ends while this call waits: withdrawn, unless its host holds the token."""
        if token in self.handed:
            return held
        return await self._withdrawn(token, held, mutates)

    async def _withdrawn(self, token: str, held: Result, mutates: bool) -> Result:
        """Withdraw a waiting request and return the vault's own answer for it: withdrawn (never
        runs), or, if the person allowed it and it started meanwhile, what it did."""
        await self._withdraw_now(token)
        got = await self._result_of("call.resume", {"resume_token": token, "wait_s": 0}, held.operation, mutates)
        # the vault refused the resume itself (at its in-flight cap): the request's own answer,
        # whose token and correlation id still name it for a lookup
        return held if got.category is Category.rate_limited else got

    async def _withdraw_now(self, token: str) -> dict[str, Any] | None:
        """The vault's answer to call.cancel (None when there was no one to ask)."""
        self._inflight.discard(token)
        if self._client is None or self._client.unusable():
            return None  # a daemon that went away took its pending requests with it
        try:
            out = await self._client.request_within(_WITHDRAW_WITHIN_S, "call.cancel",
                                                    session_id=self.session_id, resume_token=token)
            log.info("withdrew %s: %s", out.get("request_id"), out.get("state"))
            return dict(out) if isinstance(out, dict) else None
        except (VaultError, OSError) as exc:
            log.warning("could not withdraw a pending request: %s", type(exc).__name__)
            return None

    def _withdraw_if_pending(self, task: "asyncio.Task[Result]") -> None:
        if task.cancelled() or task.exception() is not None:
            return
        r = task.result()
        if r.category is Category.approval_pending and r.resume_token:
            self._keep(asyncio.ensure_future(self._withdraw_now(r.resume_token)))

    def _keep(self, task: "asyncio.Task[Any]") -> None:
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _waiting_words(r: Result) -> str:
    who = r.owner or "an approver"
    left = f"; {max(0.0, r.deadline - time.time()):.0f}s left before its deadline" if r.deadline else ""
    # the correlation id is the host's handle on the call if it cancels too late (see _settle)
    return f"waiting for {who} to approve {r.operation} (request {r.request_id}, correlation_id {r.correlation_id}){left}"


def _refused(operation: str, exc: RpcError, cid: str) -> Result:
    if exc.rpc_code == LIMIT:
        return make_result(Category.rate_limited, operation, cid,
                           f"the vault is at a limit ({exc.message})", retry_after_s=1.0)
    if exc.rpc_code == INVALID_PARAMS:
        return make_result(Category.local_failure, operation, cid,
                           f"the vault refused the arguments: {exc.message}. Nothing was sent; fix them "
                           "(the tool's input schema and vault://catalog say what is accepted)")
    return make_result(Category.local_failure, operation, cid,
                       f"the vault answered an error: {exc.message}; nothing was sent")
