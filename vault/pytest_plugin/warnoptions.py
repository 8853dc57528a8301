"""The interpreter's warning options (`python -W error -m pytest`), given to pytest-xdist's workers.

xdist starts each worker as a fresh interpreter (`python -u -c ...`, execnet's popen gateway),
which gets PYTHONWARNINGS from the environment but not the controller's `-W` flags: under
`-n 2` a `VaultsimUngradedWarning` that fails the same run without xdist was only printed. The
controller sends its `sys.warnoptions` in the worker's input and the worker applies those it
does not have, as the interpreter would have at its start. (pytest's own `-W` and
`filterwarnings` reach workers without this: they are pytest's options.)
"""

from __future__ import annotations

import builtins
import importlib
import re
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
    have = list(sys.warnoptions)
    for option in workerinput.get(KEY) or []:
        if option in have:
            have.remove(option)
            continue
        try:
            filt = parse(option)
        except (ValueError, ImportError, AttributeError, TypeError):
            continue  # the interpreter ignored a bad option too ("Invalid -W option ignored")
        sys.warnoptions.append(option)  # pytest shows DeprecationWarning only when none were given
        warnings.filterwarnings(*filt)


ACTIONS = ("default", "always", "ignore", "module", "once", "error")


def parse(option: str) -> tuple[Any, str, type[Warning], str, int]:
    """`action:message:category:module:lineno` as `python -W` reads it (the warnings module's
    documented syntax; its parser is private): an action may be any prefix of its name, the
    message is a literal prefix, the module a literal whole name, a category a builtin or a
    dotted path to a Warning subclass."""
    parts = [part.strip() for part in option.split(":")]
    if len(parts) > 5:
        raise ValueError(f"too many fields (max 5): {option!r}")
    parts += [""] * (5 - len(parts))
    action, message, category, module, lineno = parts
    action = "always" if action == "all" else action or "default"
    chosen = next((name for name in ACTIONS if name.startswith(action)), None)
    if chosen is None:
        raise ValueError(f"invalid action: {action!r}")
    number = int(lineno) if lineno else 0
    if number < 0:
        raise ValueError(f"invalid lineno: {lineno!r}")
    return (chosen, re.escape(message) if message else "", _category(category),
            re.escape(module) + r"\Z" if module else "", number)


def _category(name: str) -> type[Warning]:
    if not name:
        return Warning
    if "." in name:
        module, _, attr = name.rpartition(".")
        found = getattr(importlib.import_module(module), attr)
    else:
        found = getattr(builtins, name)
    if not (isinstance(found, type) and issubclass(found, Warning)):
        raise TypeError(f"{name!r} is not a Warning subclass")
    return found
