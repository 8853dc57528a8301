"""`vaultsim approve --script FILE`: answer prompts from rules, for CI.

Script format (YAML):

    name: ci-approver            # approver name (matches policy `owner`)
    rules:                       # first matching rule with uses left wins
      - match: {operation: create_issue, risk: create, agent: "stub*", params: {title: "Fix*"}}
        decide: allow_session    # allow_once | allow_session | deny | ignore | lock
        delay_s: 0.5             # optional: think before answering
        times: 1                 # optional: only the first N matches
    # anything unmatched is denied

Patterns are shell-style (fnmatch). `ignore` leaves the request undecided
(to exercise pending/expired paths); `lock` refuses by locking the vault
while the request is pending (a person pulling the brake). Every prompt answered is logged as one
JSON line. The approver exits cleanly when the daemon stops.
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import json
import sys
import time
from pathlib import Path
from typing import Any, Literal, TextIO

from pydantic import BaseModel, ConfigDict, Field

from .catalog import load_yaml_model
from .cli import add_home_arg
from .client import AsyncRpcClient, connect_approver
from .errors import BadInput, HomeError, RpcError
from .home import VaultHome

_Strict = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


class Match(BaseModel):
    model_config = _Strict
    operation: str = "*"
    risk: str = "*"
    agent: str = "*"
    params: dict[str, str] = Field(default_factory=dict)

    def matches(self, req: dict[str, Any]) -> bool:
        if not (fnmatch.fnmatchcase(str(req.get("operation", "")), self.operation)
                and fnmatch.fnmatchcase(str(req.get("risk", "")), self.risk)
                and fnmatch.fnmatchcase(str(req.get("agent", "")), self.agent)):
            return False
        shown = req.get("params") or {}
        return all(k in shown and fnmatch.fnmatchcase(str(shown[k]), pat) for k, pat in self.params.items())


class ApproverRule(BaseModel):
    model_config = _Strict
    match: Match = Match()
    decide: Literal["allow_once", "allow_session", "deny", "ignore", "lock"]
    delay_s: float = Field(default=0.0, ge=0, le=3600)
    times: int | None = Field(default=None, ge=1)


class ApproverScript(BaseModel):
    model_config = _Strict
    name: str = "scripted"
    rules: list[ApproverRule] = Field(default_factory=list)


def load_script(path: str | Path) -> ApproverScript:
    return load_yaml_model(path, ApproverScript)


class ScriptedApprover:
    def __init__(self, script: ApproverScript, log: TextIO = sys.stdout) -> None:
        self.script = script
        self.log = log
        self.log_failed = False
        self.used = [0] * len(script.rules)
        self.client: AsyncRpcClient | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.answered = 0

    def choose(self, req: dict[str, Any]) -> tuple[int | None, ApproverRule | None]:
        for i, rule in enumerate(self.script.rules):
            if rule.times is not None and self.used[i] >= rule.times:
                continue
            if rule.match.matches(req):
                self.used[i] += 1
                return i, rule
        return None, None

    def on_notify(self, method: str, params: dict[str, Any]) -> None:
        if method == "approval.requested":
            task = asyncio.create_task(self.answer(params))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def answer(self, req: dict[str, Any]) -> None:
        index, rule = self.choose(req)
        decision = rule.decide if rule else "deny"
        if rule and rule.delay_s:
            await asyncio.sleep(rule.delay_s)  # the script asked to think first
        if decision == "allow_session" and not req.get("allow_session_offered", True):
            decision = "allow_once"
        outcome: dict[str, Any] = {"time": time.time(), "request_id": req.get("request_id"),
                                   "operation": req.get("operation"), "agent": req.get("agent"),
                                   "pid": req.get("pid"), "scope": req.get("scope"),
                                   "rule": index, "decision": decision}
        if decision != "ignore" and self.client is not None:
            try:
                if decision == "lock":
                    await self.client.request("lock")
                else:
                    await self.client.request("decide", request_id=req["request_id"], decision=decision)
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

    async def run(self, home: VaultHome, ready: asyncio.Event | None = None) -> None:
        self.client, answer = await connect_approver(home, self.script.name, self.on_notify)
        for req in answer.get("pending", []):
            self.on_notify("approval.requested", req)
        if ready is not None:
            ready.set()
        await self.client.closed.wait()
        for task in list(self.tasks):
            task.cancel()


def configure(p: argparse.ArgumentParser) -> None:
    add_home_arg(p)
    p.add_argument("--script", required=True, help="rules YAML")
    p.add_argument("--log", help="append answered prompts (JSON lines) here instead of stdout")


def run(args: argparse.Namespace) -> int:
    from .proc_guard import make_undumpable
    make_undumpable()  # it will read the approver token
    script = load_script(args.script)
    home = VaultHome.resolve(args.home)
    try:
        log: TextIO = open(args.log, "a", encoding="utf-8") if args.log else sys.stdout
    except OSError as exc:
        raise BadInput(f"--log: cannot open {args.log}: {exc.strerror}") from None
    try:
        asyncio.run(ScriptedApprover(script, log).run(home))
    except KeyboardInterrupt:
        pass
    finally:
        if args.log:
            log.close()
    print("vaultsim approve: daemon closed the connection; exiting", file=sys.stderr)
    return 0
