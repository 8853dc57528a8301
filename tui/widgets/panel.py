"""A Static that redraws only when its text changed, and re-lays out only when its height did.

Every notification and every countdown tick re-syncs the screen. Re-setting
an unchanged panel, or re-laying out the whole screen because a countdown in
a panel went from 1:35 to 1:34, is what a person would feel as lag when
requests arrive quickly: a layout pass re-renders every widget on the screen.
"""

from __future__ import annotations

from rich.text import Text
from textual.visual import visualize
from textual.widgets import Static


class TextPanel(Static):
    _shown: Text | None = None
    _lines: int = -1

    def set_text(self, text: Text) -> None:
        if text == self._shown:
            return
        width = self.content_size.width
        # RenderStyles answers the RulesMap lookups get_height makes; Textual's Widget passes it the same way
        lines = (visualize(self, text).get_height(self.styles, width)  # type: ignore[arg-type]
                 if width > 0 else -1)
        # an unknown width (not laid out yet) or a new line count needs a layout pass
        self.update(text, layout=lines < 0 or lines != self._lines)
        self._shown, self._lines = text, lines
