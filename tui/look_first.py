"""A buried request is looked at before an allow key reaches it.

An agent can queue thirty harmless prompts and one `delete_release` behind them. A person pressing
`o` again and again moves down the queue with each decision (the cursor lands on the next row), so
the key meant for the thirtieth typo fix allows the delete. Here an allow on a request that was
already waiting when the person decided the previous one, and is of another operation or risk,
is held back once with a warning; the same key again allows it. Deny is never held back, and a
request that arrived after the previous decision (nothing was queued behind it) is not either.
A selected request that leaves without this person deciding it (its agent withdrew it) counts as
decided: the row that then comes under the cursor is held back the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vault.text import shown

from tui.state import Request


@dataclass
class LookFirst:
    last: tuple[str, str] | None = None  # (operation, risk) of the request this person last decided
    queued: frozenset[str] = frozenset()  # requests waiting behind it when it was decided
    looked: set[str] = field(default_factory=set)  # held back once already: the next key goes

    def decided(self, req: Request, waiting: set[str]) -> None:
        self.last = (req.operation, req.risk)
        self.queued = frozenset(waiting - {req.request_id})
        self.looked &= waiting  # only requests still waiting are worth remembering

    def hold(self, req: Request) -> str:
        """Why an allow of `req` is held back this once ("" to let it go)."""
        if self.last is None or req.request_id not in self.queued or req.request_id in self.looked:
            return ""
        if (req.operation, req.risk) == self.last:
            return ""
        self.looked.add(req.request_id)
        return self.why(req)

    def why(self, req: Request) -> str:
        """The warning for `req` while it is held back once and still waits ("" otherwise)."""
        if req.request_id not in self.looked or self.last is None:
            return ""
        return (f"look first: this is {shown(req.operation)} ({shown(req.risk)}), not "
                f"{shown(self.last[0])} like the one before it; press the key again to allow it")
