"""Unlock asks first: a modal that returns a typed answer (`True` = unlock).

Locking is the safe direction and happens at once; unlocking lets agents'
calls through to the gate again, so it takes a second, deliberate key.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label


class ConfirmUnlock(ModalScreen[bool]):
    BINDINGS = [
        Binding("y", "answer(True)", "unlock"),
        Binding("n,escape", "answer(False)", "stay locked"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label("Unlock the vault?", classes="title")
            yield Label("Agents' calls will reach the gate again: the policy decides which "
                        "of them ask you first.")
            with Horizontal(id="buttons"):
                yield Button("Unlock (y)", id="yes", variant="warning")
                yield Button("Stay locked (n)", id="no", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()  # the default is the safe answer

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, unlock: bool) -> None:
        self.dismiss(unlock)
