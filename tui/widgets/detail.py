"""The selected request in full, and what each answer would mean in plain words.

An answer the policy does not offer (allow for session on a per_call
operation) is shown struck out with the reason, so the person sees why `s` is
missing rather than wondering.

Everything the agent chose (its name, the label of the host it claims to act
for, the parameters, the scope made from them) is escaped (`vault.text.shown`),
string values are quoted so that none can pass for another parameter, and a
value that could still mislead (hidden characters, look-alike letters of
another script, a value the vault cut short) gets a `!` line saying why.

The prompt carries each parameter cut to 80 characters; the pane shows them
in full once `approval.detail` has answered (the screen asks when a cut
request is selected), wrapped, in a scrolling pane, and says so while they
load or if they could not be read (shown cut, flagged, until then).
"""

from __future__ import annotations

from rich.text import Text

from vault.text import shown

from tui.state import Request
from tui.style import DOUBT_STYLE, clock_time, countdown, risk_text
from tui.widgets.panel import TextPanel



class RequestDetail(TextPanel):
    def show(self, req: Request | None, note: str = "", *, now: float, me: str | None = None,
             exe: str | None = None, held: str = "") -> None:
        if req is None:
            self.set_text(Text("Nothing to decide. Requests appear here as agents ask.", style="dim"))
            return
        t = Text()
        t.append(shown(req.operation), style="bold")
        t.append(" · ")
        t.append_text(risk_text(req.risk))
        # the pid and program are what the vault saw; the name and any label are the agent's words
        ran = f", {shown(exe)}" if exe else ""
        t.append(f" · {shown(req.mode)} · {shown(req.agent)} (pid {req.pid}{ran}) · run {shown(req.run_id or 'default')}\n")
        if held:  # an allow key was held back: this request is not the kind just decided
            t.append(f" ! {held}\n", style=DOUBT_STYLE)
        if req.client:
            # the label is the agent's word; only the host's ancestry is checked by the daemon
            host = "the host pid is an ancestor of its process" if req.client_verified else "host not verified"
            t.append(f"acting for: {shown(req.client)} (claimed; {host})\n", style="italic")
        t.append(f"scope: {shown(req.scope)}\n")
        t.append(f"params: {req.params_text()}\n")
        if note:  # the full values are loading, or could not be read
            t.append(f" … {shown(note)}\n", style=DOUBT_STYLE)
        for what, doubt in req.doubts(me):
            t.append(f" ! {what}: {doubt}\n", style=DOUBT_STYLE)
        t.append(f"owner: {shown(req.owner or 'any approver')} · asked {clock_time(req.created)} · "
                 f"deadline in ")
        t.append_text(countdown(req.time_left(now)))
        t.append(f" · {shown(req.request_id)}\n")
        for key, meaning, offered in req.meanings():
            t.append(f" {key} ", style="bold reverse" if offered else "dim strike")
            t.append(f" {shown(meaning)}\n", style="" if offered else "dim")
        self.set_text(t)
