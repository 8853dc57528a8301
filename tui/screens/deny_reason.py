"""`D`: deny with a short reason, a modal that returns the note (None: not denied).

The reason is the one thing of the approver's the agent receives (in its
`approval_denied` Result), so it is one printable line of at most 200
characters; an agent that changes course after reading it is what a team
wants to see. Escape cancels: nothing is decided.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from vault.text import shown

MAX_REASON = 200  # the daemon's limit (vault.daemon.approver_api.DecideParams)


class DenyReason(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, operation: str, agent: str) -> None:
        super().__init__()
        self.operation, self.agent = operation, agent

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            # the agent chose its name: shown as text, never as markup (`[@click=...]` would be an action)
            yield Label(f"Deny {shown(self.operation)} for {shown(self.agent)}", classes="title", markup=False)
            yield Label("Why? The agent receives this note in its result (enter sends, escape cancels).")
            yield Input(placeholder="e.g. use the staging environment", max_length=MAX_REASON, id="reason")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        # one printable line: what the daemon accepts (control characters are dropped here)
        self.dismiss("".join(c for c in event.value if c.isprintable()).strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
