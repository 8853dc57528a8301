"""The demo's TUI: the ordinary approver plus a driver that runs the demo agents.

The agents start only once the TUI is subscribed; before that, a call that
needs approval would be refused as `approval_unroutable` (no approver could
receive it). The first agent runs the demo plan; after it exits a second,
fresh process creates once more and is asked again: a session grant never
outlives its process. The driver narrates in the activity pane (lines marked
"demo:") so a person can follow what happens and when it is over.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

from textual import work

from vault.home import VaultHome

from tui.app import VaultApp
from tui.demo import DemoWorld, Stopper
from tui.messages import LinkUp

SECOND_AGENT_TASK = {"plan_inline": {
    "agent": "demo-agent",
    "steps": [{"call": "create_issue", "params": {"title": "Login page is slow: add a dashboard"},
               "idempotency_key": "auto"}],
    "final": "second demo agent done: one create in a fresh process",
}}


class DemoApp(VaultApp):
    TITLE = "vaultsim demo"

    def __init__(self, world: DemoWorld, plan: Path, stopper: Stopper | None = None) -> None:
        super().__init__(VaultHome(world.home), name="human", run_id="demo")
        self.world = world
        self.plan = plan
        self.stopper = stopper
        self.started = False
        self.finished = False

    # Textual also runs VaultApp's handlers of the same name (it dispatches along
    # the MRO), so these add to them rather than call super()

    def on_mount(self) -> None:
        if self.stopper is not None:  # a stop signal quits from here on (see tui.demo.Stopper)
            self.stopper.attach(asyncio.get_running_loop())

    def on_link_up(self, m: LinkUp) -> None:
        if not self.started:
            self.started = True
            self._drive()

    def say(self, text: str) -> None:
        self.state.note(self.now(), f"demo: {text}", "demo")
        self.bump()

    @work(exclusive=True, group="demo", exit_on_error=False)
    async def _drive(self) -> None:
        self.say(f"remote at {self.world.remote_url}; the vault is unlocked")
        await self._run_agent("agent-1", ["--plan", str(self.plan)],
                              f"agent 1 runs {self.plan.name}: a read, two creates, a delete")
        await self._run_agent("agent-2", [], "agent 2, a fresh process, creates once more: "
                                             "agent 1's session grant did not survive it", SECOND_AGENT_TASK)
        self.finished = True
        self.say("finished. Press q to quit: every process stops and the demo home is removed")

    async def _run_agent(self, label: str, args: list[str], intro: str,
                         task: dict[str, Any] | None = None) -> None:
        proc = self.world.start_agent(label, args, task)
        self.say(f"{intro} (pid {proc.pid})")
        rc = await _exited(proc)
        self.say(f"{label} (pid {proc.pid}) exited {rc}: {self.world.final_line(label)}")


async def _exited(proc: subprocess.Popen[Any]) -> int:
    # poll rather than wait in a thread: quitting must never hang on a live agent
    while (rc := proc.poll()) is None:
        await asyncio.sleep(0.1)
    return rc
