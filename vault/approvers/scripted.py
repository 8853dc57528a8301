"""`vaultsim approve --script FILE`: answer prompts from rules, for CI.

Script format (YAML):

    name: ci-approver            # approver name (matches policy `owner`)
    rules:                       # first matching rule with uses left wins
      - match: {operation: create_issue, risk: create, agent: "stub*", params: {title: "Fix*"}}
        decide: allow_session    # allow_once | allow_session | deny | ignore | lock
        delay_s: 0.5             # optional: think before answering (seconds), or a distribution:
                                 #   {min: 1, max: 4}          uniform
                                 #   {median: 2, sigma: 0.5}   log-normal, as people's think times are
        reason: "use staging"    # optional, with deny: the note the agent receives
        times: 1                 # optional: only the first N matches
    seed: 7                      # optional: the think-time draws repeat from run to run
    # anything unmatched is denied

The script tells the vault it has seen each prompt, detail included, when the
prompt arrives (`seen`); its think time then runs before it answers, so the
vault's fatigue figures (vault.gate.fatigue) measure a script as they would a
person: a 0.2 s think time is a rubber-stamp, a 3 s one is not.

Patterns are shell-style (fnmatch); a `params` pattern may also be a YAML number
or boolean (`force: true`), matched against the value as JSON writes it (`true`,
`12`), as is any non-string value. The agent chooses its name and its parameter
values, so a rule is not fooled by how they are spelled: each is also checked
in its folded forms (NFKC, so fullwidth `ｐｒｏｄ` is `prod`; case-folded;
without accents and invisible format characters), and a value that cannot be
checked (cut short by the vault, `[hidden]`, or a word mixing look-alike
letters of two scripts such as a Cyrillic `р` in `рrod`) counts against the
agent: a `deny` or `lock` rule that tests it matches when any form fits (also as
a person reads it, vault.lookalike: blanks trimmed and collapsed, tabs included,
and a word wholly in Cyrillic or Greek look-alikes read as the Latin it shows), or
when it cannot be checked; an `allow_once`, `allow_session` or `ignore` rule
matches only the value as given, only when it holds no such spelling. A value
the vault cut for the prompt (80 characters) is not checked cut: when a rule
tests one, the script asks the vault for the request's full parameters
(`approval.detail`, once per prompt) and matches the whole value, so a long
harmless value can be allowed and a word hidden past the cut is still denied;
only if that answer cannot be had (the request settled meanwhile, an older
daemon) does the cut value count as uncheckable. The
agent name is the agent's own claim: a rule on `agent` sorts honest agents,
it does not authenticate one. `ignore` leaves the request undecided
(to exercise pending/expired paths); `lock` refuses by locking the vault
while the request is pending (a person pulling the brake). Every prompt answered is logged as one
JSON line. The approver exits cleanly when the daemon stops; a daemon that is stopped (SIGSTOP)
or stuck keeps its requests waiting, and the approver says so on stderr once one has waited 5 s, and
again when it answers (vault.silence), never sending a decision twice. A prompt that does
not fit `approval.requested`'s model (vault.wire) is reported on stderr and left
undecided; the approver goes on with the others.

SIGTERM, or SIGHUP (its terminal closed), disconnects it cleanly (a prompt it is
still thinking over stays pending, for another approver) and exits 0; Ctrl-C
(SIGINT) the same with exit 130 and one line on stderr. A SIGHUP or SIGINT
ignored at start stays ignored (`nohup`, a script's `&` job; vault.stop_signals).
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Literal, TextIO

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from vault import stop_signals
from vault.atomic import append_whole, open_append
from vault.catalog import HIDDEN, load_yaml_model
from vault.cli.main import add_home_arg, interrupted_line, path_arg
from vault.client import AsyncRpcClient, connect_approver
from vault.silence import SilenceWatch
from vault.errors import BadInput, HomeError, RpcError
from vault.home import VaultHome
from vault.lookalike import skeletons
from vault.text import forms, mixed_scripts, was_clipped
from vault.wire import ApprovalDetail, ApprovalRequested, WireError, read

_Strict = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


# decisions that let a call through (or leave it waiting): they must not match a doubtful value
PERMISSIVE = frozenset({"allow_once", "allow_session", "ignore"})


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _uncheckable(text: str) -> bool:
    """A value no pattern can be trusted on: cut short, hidden, or spelled with look-alikes."""
    return text == HIDDEN or was_clipped(text) or bool(mixed_scripts(text))


def _plain(text: str) -> bool:
    """Every folded form of `text` is itself or its case-fold: nothing to fold away."""
    return forms(text) <= {text, text.casefold()}


def fits(pattern: str | int | bool, value: Any, permissive: bool) -> bool:
    """Whether a rule's `pattern` matches an agent-chosen `value` (see the module doc)."""
    text, pat = _text(value), _text(pattern)
    if permissive:
        return not _uncheckable(text) and _plain(text) and fnmatch.fnmatchcase(text, pat)
    if _uncheckable(text):
        return True
    folded = sorted(forms(pat))
    if any(fnmatch.fnmatchcase(t, p) for t in forms(text) for p in folded):
        return True
    # what a person reads: ` prod-1`, `drop  table`, `drop\ttable` and an all-Cyrillic `ехес` are
    # `prod-1`, `drop table` and `exec` to the eye, and no folded form above has them so
    return any(fnmatch.fnmatchcase(t, p) for t in skeletons(text) for p in skeletons(pat))


class Match(BaseModel):
    model_config = _Strict
    operation: str = "*"
    risk: str = "*"
    agent: str = "*"
    params: dict[str, StrictStr | StrictInt | StrictBool] = Field(default_factory=dict)

    def tests_cut(self, req: ApprovalRequested) -> bool:
        """Whether this rule tests a parameter whose notified value the vault cut short."""
        return any(was_clipped(req.params.get(k)) for k in self.params)

    def matches(self, req: ApprovalRequested, decide: str = "deny") -> bool:
        """For a rule deciding `decide`: an allowing rule is strict, a refusing one generous."""
        permissive = decide in PERMISSIVE
        if not (fnmatch.fnmatchcase(req.operation, self.operation)
                and fnmatch.fnmatchcase(req.risk, self.risk)
                and (self.agent == "*" or fits(self.agent, req.agent, permissive))):
            return False
        shown = req.params
        return all(k in shown and fits(pat, shown[k], permissive) for k, pat in self.params.items())


MAX_THINK_S = 3600.0


class Think(BaseModel):
    """A think time drawn per prompt: uniform between `min` and `max`, or log-normal around
    `median` (people's decision times are skewed: mostly quick, sometimes long)."""

    model_config = _Strict
    min: float | None = Field(default=None, ge=0, le=MAX_THINK_S)
    max: float | None = Field(default=None, ge=0, le=MAX_THINK_S)
    median: float | None = Field(default=None, gt=0, le=MAX_THINK_S)
    sigma: float = Field(default=0.5, ge=0, le=3)

    @model_validator(mode="after")
    def _one_shape(self) -> "Think":
        uniform = self.min is not None and self.max is not None
        if uniform == (self.median is not None):
            raise ValueError("a think time is {min, max} (uniform) or {median, sigma} (log-normal)")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("min is more than max")
        return self

    def draw(self, rng: random.Random) -> float:
        if self.median is not None:
            return min(MAX_THINK_S, rng.lognormvariate(0.0, self.sigma) * self.median)
        return rng.uniform(self.min or 0.0, self.max or 0.0)


class ApproverRule(BaseModel):
    model_config = _Strict
    match: Match = Match()
    decide: Literal["allow_once", "allow_session", "deny", "ignore", "lock"]
    delay_s: Annotated[float, Field(ge=0, le=MAX_THINK_S)] | Think = 0.0
    reason: str | None = Field(default=None, min_length=1, max_length=200)
    times: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _reason_with_deny(self) -> "ApproverRule":
        if self.reason is not None:
            if self.decide != "deny":
                raise ValueError("reason goes with decide: deny")
            if not self.reason.isprintable():
                raise ValueError("reason is printable text on one line")
        return self

    def think_s(self, rng: random.Random) -> float:
        return self.delay_s.draw(rng) if isinstance(self.delay_s, Think) else float(self.delay_s)


class ApproverScript(BaseModel):
    model_config = _Strict
    name: str = "scripted"
    rules: list[ApproverRule] = Field(default_factory=list)
    seed: int | None = None


def load_script(path: str | Path) -> ApproverScript:
    return load_yaml_model(path, ApproverScript)


class DecisionLog:
    """`--log FILE`: each answered prompt appended as one whole line or not at all. Through a
    buffered text file a full disk took part of a line: the log ended torn, and the rest of the
    line came (if ever) after the next one began."""

    def __init__(self, path: str) -> None:
        self.fd = open_append(path, 0o666)  # a FIFO with no reader: said at once, not waited on

    def write(self, line: str) -> int:
        append_whole(self.fd, line.encode("utf-8"))
        return len(line)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        os.close(self.fd)


class ScriptedApprover:
    def __init__(self, script: ApproverScript, log: TextIO | DecisionLog = sys.stdout) -> None:
        self.script = script
        self.log = log
        self.log_failed = False
        self.used = [0] * len(script.rules)
        self.client: AsyncRpcClient | None = None
        # a stopped or stuck daemon holds a decision unanswered: said, and waited for (a decide
        # sent again could be a second decision); said again when the daemon answers (vault.silence)
        self.watch = SilenceWatch(lambda method: self.say(f"the daemon is not answering ({method} waits for it; "
                                                          "stopped, or stuck)"),
                                  lambda: self.say("the daemon is answering again"))
        self.tasks: set[asyncio.Task[None]] = set()
        self.answered = 0
        self.rng = random.Random(script.seed)

    def choose(self, req: ApprovalRequested) -> tuple[int | None, ApproverRule | None]:
        return self.first_match(self.script.rules, req)

    def sending(self, method: str, request_id: str | None) -> None:
        """Called just before this approver sends `decide` (with its request id) or `lock`:
        a caller that must tell its own approver's acts from others' keeps them here."""

    async def before_deciding(self) -> None:
        """Awaited after thinking, just before a decision is sent: a caller may hold decisions
        here for a while (the runner does while its intruder runs)."""

    def first_match(self, rules: list[ApproverRule],
                    req: ApprovalRequested) -> tuple[int | None, ApproverRule | None]:
        """The first rule that matches and has uses left (counted in `used`), in the order given."""
        for i, rule in enumerate(rules):
            if rule.times is not None and self.used[i] >= rule.times:
                continue
            if rule.match.matches(req, rule.decide):
                self.used[i] += 1
                return i, rule
        return None, None

    def on_notify(self, method: str, params: dict[str, Any]) -> None:
        if method == "approval.requested":
            try:
                req = read(ApprovalRequested, params, "approval.requested notification")
            except WireError as exc:
                print(f"vaultsim approve: ignored a prompt: {exc.message}", file=sys.stderr)
                return
            task = asyncio.create_task(self.answer(req))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def in_full(self, req: ApprovalRequested) -> ApprovalRequested:
        """`req` with its parameters uncut (`approval.detail`) when a rule with uses left tests
        one the vault cut; otherwise, or if the vault cannot answer, `req` as notified (a cut
        value then stays uncheckable)."""
        if self.client is None or not any(
                (r.times is None or self.used[i] < r.times) and r.match.tests_cut(req)
                for i, r in enumerate(self.script.rules)):
            return req
        try:
            detail = read(ApprovalDetail, await self.client.request("approval.detail",
                                                                    request_id=req.request_id))
        except (RpcError, WireError):
            return req  # settled meanwhile, or an older daemon
        if detail.request_id != req.request_id or detail.params.keys() != req.params.keys():
            return req
        return req.model_copy(update={"params": detail.params})

    async def answer(self, req: ApprovalRequested) -> None:
        try:
            req = await self.in_full(req)
        except HomeError:
            return  # the daemon went away
        index, rule = self.choose(req)
        decision = rule.decide if rule else "deny"
        think = rule.think_s(self.rng) if rule else 0.0
        if self.client is not None and decision != "ignore":
            try:  # a script reads the whole request at once: shown and detail, now
                await self.client.request("seen", request_id=req.request_id, detail=True)
            except RpcError:
                pass  # an older daemon: the vault falls back to when it sent the prompt
            except HomeError:
                return
        if think:
            await asyncio.sleep(think)  # the script asked to think first
        if decision != "ignore":
            await self.before_deciding()
        if decision == "allow_session" and not req.allow_session_offered:
            decision = "allow_once"
        outcome: dict[str, Any] = {"time": time.time(), "request_id": req.request_id,
                                   "operation": req.operation, "agent": req.agent,
                                   "pid": req.pid, "scope": req.scope,
                                   "rule": index, "decision": decision}
        if think:
            outcome["think_s"] = round(think, 3)
        if decision != "ignore" and self.client is not None:
            try:
                if decision == "lock":
                    self.sending("lock", None)
                    await self.client.request("lock")
                else:
                    reason = {"reason": rule.reason} if rule is not None and rule.reason else {}
                    self.sending("decide", req.request_id)
                    await self.client.request("decide", request_id=req.request_id, decision=decision,
                                              **reason)
                outcome["accepted"] = True
            except RpcError as exc:
                outcome["accepted"] = False
                outcome["error"] = exc.message
            except HomeError:
                return
        self.answered += 1
        try:
            self.log.write(json.dumps(outcome) + "\n")
            self.log.flush()
        except OSError as exc:  # e.g. a full disk: keep deciding, say once that the log stopped
            if not self.log_failed:
                self.log_failed = True
                print(f"vaultsim approve: cannot write the decision log ({exc.strerror}); "
                      "decisions go on unlogged", file=sys.stderr)

    def say(self, text: str) -> None:
        """The approver's word on the daemon itself (not answering, answering again): on stderr."""
        print(f"vaultsim approve: {text}", file=sys.stderr, flush=True)

    async def run(self, home: VaultHome, ready: asyncio.Event | None = None) -> None:
        self.client, answer = await connect_approver(home, self.script.name, self.on_notify, watch=self.watch)
        for req in answer.get("pending", []):
            self.on_notify("approval.requested", req)
        if ready is not None:
            ready.set()
        await self.client.closed.wait()
        for task in list(self.tasks):
            task.cancel()


def configure(p: argparse.ArgumentParser) -> None:
    add_home_arg(p)
    p.add_argument("--script", required=True, type=path_arg, help="rules YAML")
    p.add_argument("--log", type=path_arg, help="append answered prompts (JSON lines) here instead of stdout")


def run(args: argparse.Namespace) -> int:
    from vault.proc_guard import make_undumpable
    make_undumpable()  # it will read the approver token
    script = load_script(args.script)
    home = VaultHome.resolve(args.home).check()
    try:
        log: TextIO | DecisionLog = DecisionLog(args.log) if args.log else sys.stdout
    except OSError as exc:
        raise BadInput(f"--log: cannot open {args.log}: {exc.strerror}") from None
    try:
        stopped_by = asyncio.run(_serve(ScriptedApprover(script, log), home))
    finally:
        if args.log:
            log.close()
    if stopped_by == signal.SIGINT:  # Ctrl-C: an interrupt (130), said in one line
        print(interrupted_line("approve"), file=sys.stderr)
        return 130
    if stopped_by is not None:
        print(f"vaultsim approve: {stopped_by.name}: disconnected from the daemon; exiting", file=sys.stderr)
        return 0
    print("vaultsim approve: daemon closed the connection; exiting", file=sys.stderr)
    return 0


async def _serve(approver: ScriptedApprover, home: VaultHome) -> signal.Signals | None:
    """Answer prompts until the daemon closes the connection (None) or a stop signal comes (that
    signal): then the connection is closed, so the daemon sees this approver leave at once."""
    stopped_by: list[signal.Signals] = []
    stop = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        if not stopped_by:
            stopped_by.append(sig)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in stop_signals.caught():  # before any handler of ours: one ignored at start stays so
        loop.add_signal_handler(sig, on_signal, sig)
    serving = asyncio.create_task(approver.run(home))
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not serving.done():
            serving.cancel()
        if approver.client is not None:
            await approver.client.close()
        for task in list(approver.tasks):  # prompts still thought over stay pending
            task.cancel()
        await asyncio.gather(serving, *approver.tasks, return_exceptions=True)
    if not stopped_by:
        serving.result()  # the daemon closed the connection, or it could not be reached (raised)
    return stopped_by[0] if stopped_by else None
