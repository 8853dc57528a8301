"""Prompt counters for the current run, the fatigue meter, and the approval-fatigue warnings.

The numbers come from the daemon's `stats` (counted at the gate, not by the
TUI). A warning shows when a scope already granted in the run is asked again
or when reads are prompting: both train people to press yes without reading.
The meter is this person's own pace (`TuiState.meter`): prompts in the last
five minutes, rubber-stamps since the TUI started, and a warning when the
newest approval came too fast or without the detail being read.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from vault.text import shown

from tui.widgets.panel import TextPanel


class PromptCounters(TextPanel):
    def show(self, run: str | None, c: dict[str, Any], meter: tuple[int, int, str] = (0, 0, "")) -> None:
        t = Text()
        recent, stamps, warning = meter
        t.append(f"Fatigue: {recent} prompts in 5 min · {stamps} rubber-stamps\n",
                 style="bold" if stamps else "")
        if warning:
            t.append(f" ! {warning}\n", style="bold white on red")
        t.append(f"Prompts, run {shown(run or '-')}: ", style="bold")
        t.append(f"{c.get('prompts', 0)}\n", style="bold")
        asked: dict[str, int] = c.get("scopes_asked") or {}
        granted: dict[str, int] = c.get("scopes_granted") or {}
        for scope in sorted(asked):
            t.append(f" {asked[scope]:>2} asked {granted.get(scope, 0):>2} granted  {shown(scope)}\n")
        decisions: dict[str, int] = c.get("decisions") or {}
        t.append(" decisions: " + (", ".join(f"{shown(k)} {v}" for k, v in sorted(decisions.items())) or "none")
                 + "\n")
        repeated = int(c.get("repeated_scope_prompts") or 0)
        reads = int(c.get("read_prompts") or 0)
        destructive = int(c.get("destructive_session_grants") or 0)
        if repeated:
            again = [s for s, n in sorted(asked.items()) if n > 1]
            t.append(f" ! fatigue: a granted scope was asked again ({repeated}x)"
                     + (f": {', '.join(map(shown, again))}" if again else "") + "\n", style="bold black on yellow")
        if reads:
            t.append(f" ! fatigue: reads are prompting ({reads}x)\n",
                     style="bold black on yellow")
        if destructive:
            t.append(f" ! {destructive} session grant(s) cover a destructive operation\n",
                     style="bold white on red")
        self.set_class(bool(repeated or reads), "-fatigue")
        self.set_text(t)
