"""A tab stop set with C1's HTS (U+0088), as ESC H sets one (contract §7, vault.runner.drawn).

A terminal in UTF-8 mode reads U+0088 as HTS. The reader drew it as nothing and set no stop, so a
tab after it went to the line's end, not to the stop: a line a terminal shows as `done` read as
`not done ...`, and the other way round.
"""

from __future__ import annotations

import pytest

from vault.runner.claims import claim_of
from vault.runner.drawn import as_shown

# `not done`, every stop cleared, a stop set at column 4, back to column 0, a tab (to the stop),
# back 4 columns and `done` there, the rest erased: a terminal shows `done`
OVER = "not done\x1b[3g\x1b[1G\x1b[4C{hts}\x1b[1G\t\x1b[4Ddone\x1b[K"
# `done: 3 steps`, every stop cleared, a stop set at column 9, back to column 0: the tab lands on
# that stop and `not` is drawn there, over `steps`, not at the line's end
BESIDE = "done: 3 steps\x1b[3g\x1b[1G\x1b[9C{hts}\x1b[1G\tnot"


@pytest.mark.parametrize("template", [OVER, BESIDE], ids=["over", "beside"])
def test_c1_hts_sets_a_stop_as_esc_h_does(template: str) -> None:
    c1, esc = template.format(hts="\x88"), template.format(hts="\x1bH")
    assert as_shown(c1) == as_shown(esc)
    assert claim_of(c1) == claim_of(esc)


def test_c1_hts_draws_nothing() -> None:
    assert as_shown("do\x88ne") == "done"
    assert as_shown("a\x87\x88\x89b") == "ab"
