"""Red team 45c: one connection and one session for all steps, with one deliberate reconnect in
the middle (stdlib), written from docs/agent-contract.md.

Section 3: a session ends when the connection that opened it closes, and its grants end with it;
a new session's next call in a scope the old one was granted asks the owner again. So the agent
reconnects once, in the middle of its steps, at the first step boundary where that costs nothing:
no wait of its own pending (it runs one step at a time, so none is), and no later step calls a
`session`-mode operation an earlier step already called (that grant would be lost and asked for
again). Where no boundary is free it does not reconnect. The old session is closed (session.close)
before the new connection opens, so two sessions of the process are never open at once.

RT45C_RECONNECT=pending reconnects instead in the middle of its first wait for a person: the call
answered `approval_pending`, its token kept, the session closed and a new one opened, then the
wait collected with `call.resume` on the new session (section 3: a resume token is the agent's,
its name and run id; a disconnection is no cancellation, README's MCP section).
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt45c_lib as lib  # noqa: E402


class MidWait(lib.Runner):
    """Reconnects once, between a call's `approval_pending` and its first resume."""

    moved = False

    def collect(self, step: dict[str, Any], rec: dict[str, Any], res: dict[str, Any]) -> Any:
        if not self.moved and res.get("resume_token") and self.left() > 1.0:
            self.moved = True
            rec["token"] = str(res["resume_token"])
            self.journal.save()
            self.log(f"reconnecting while {step['id']} waits")
            self.reconnect()
        return super().collect(step, rec, res)


def main() -> int:
    task = lib.load_task()
    steps = task.get("steps") or []
    pending = os.environ.get("RT45C_RECONNECT") == "pending"
    runner = (MidWait if pending else lib.Runner)(task, client="rt45c-reconnect", blocking=not pending)
    try:
        try:
            cat = runner.vault.rpc("catalog")
            modes = {o.get("name"): (o.get("approval") or {}).get("mode") for o in cat.get("operations") or []
                     if isinstance(o, dict)}
        except lib.VaultError:
            modes = {}
        index = {s["id"]: i for i, s in enumerate(steps)}
        state = {"reconnected": False}

        def free_after(i: int) -> bool:
            before = {s["call"] for s in steps[: i + 1] if modes.get(s["call"]) != "auto"}
            after = {s["call"] for s in steps[i + 1:] if modes.get(s["call"]) != "auto"}
            return not (before & after) and i + 1 < len(steps)

        def between(step: dict[str, Any]) -> None:
            i = index[step["id"]]
            if pending or state["reconnected"] or i + 1 < len(steps) // 2 or not free_after(i):
                return
            state["reconnected"] = True
            runner.log(f"reconnecting after step {step['id']}")
            runner.reconnect()

        message = runner.run_all(between)
    except lib.Finish as f:
        message = str(f)
    finally:
        runner.close()
    print(message, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
