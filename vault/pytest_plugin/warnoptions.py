"""The interpreter's warning options (`python -W error -m pytest`), given to pytest-xdist's workers.

xdist starts each worker as a fresh interpreter (`python -u -c ...`, execnet's popen gateway),
which gets PYTHONWARNINGS from the environment but not the controller's `-W` flags: under
`-n 2` a `VaultsimUngradedWarning` that fails the same run without xdist was only printed. The
controller sends its `sys.warnoptions` in the worker's input and the worker applies those it
does not have, as the interpreter would have at its start. (pytest's own `-W` and
`filterwarnings` reach workers without this: they are pytest's options.)
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

KEY = "vaultsim_warnoptions"


def forward(workerinput: dict[str, Any]) -> None:
    """Controller: this interpreter's warning options, for one worker."""
    workerinput[KEY] = list(sys.warnoptions)


def apply(workerinput: dict[str, Any]) -> None:
    """Worker: the controller's warning options this interpreter did not start with (an option
    from PYTHONWARNINGS it has already), in their order, so a later one wins as at start-up."""
    from _pytest.config import parse_warning_filter
    have = list(sys.warnoptions)
    for option in workerinput.get(KEY) or []:
        if option in have:
            have.remove(option)
            continue
        try:
            filt = parse_warning_filter(option, escape=True)  # python -W's syntax and matching
        except Exception:  # the interpreter ignored a bad option too ("Invalid -W option ignored")
            continue
        sys.warnoptions.append(option)  # pytest shows DeprecationWarning only when none were given
        warnings.filterwarnings(*filt)
