"""How big a loaded YAML document really is, counting every alias as the copy it stands for.

YAML aliases let a small file describe a huge value: nine lines of `&a [*b, *b, ...]`
("billion laughs") load in microseconds into a few shared lists, and the first thing
that walks the value as a tree (json.dumps of an agent's task file, pydantic, deepcopy,
printing) makes a billion copies and runs the machine out of memory. A `&a [*a]`
alias loads as a list that holds itself, and every such walk fails or never ends.

`expanded_weight` walks the loaded value once per distinct container (shared ones are
counted from memory, not walked again) and adds what the tree would weigh: one per
value, plus the length of every string and the digits of every integer. The file
limit (16 MiB of text) already bounds a document without aliases, so a weight far past
it can only come from aliases, and a reader refuses it by name instead of expanding it.
"""

from __future__ import annotations

from typing import Any

# A file without aliases weighs about its size in characters; read files are at most 16 MiB.
MAX_WEIGHT = 64 << 20


class Unbounded(ValueError):
    """The value refers to itself, or its aliases expand past MAX_WEIGHT."""


def _scalar_weight(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return 1 + len(value)
    if isinstance(value, int):
        return 1 + value.bit_length() // 3  # about its decimal digits
    return 1


def _children(node: dict[Any, Any] | list[Any]) -> list[Any]:
    if isinstance(node, dict):
        return [*node.keys(), *node.values()]
    return node


def expanded_weight(doc: Any, limit: int = MAX_WEIGHT) -> int:
    """The weight of `doc` written out as a tree; Unbounded past `limit` or on a cycle."""
    if not isinstance(doc, (dict, list)):
        return _scalar_weight(doc)
    weights: dict[int, int] = {}  # id of a finished container -> its weight
    open_: set[int] = set()  # containers being walked: meeting one again is a cycle
    stack: list[tuple[Any, bool]] = [(doc, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            total = 1
            for child in _children(node):
                total += weights[id(child)] if isinstance(child, (dict, list)) else _scalar_weight(child)
            if total > limit:
                raise Unbounded(f"its aliases expand past {limit >> 20} MiB")
            open_.discard(key)
            weights[key] = total
            continue
        if key in weights:
            continue
        if key in open_:
            raise Unbounded("a value refers to itself (an alias inside its own anchor)")
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if isinstance(c, (dict, list)) and id(c) not in weights)
    return weights[id(doc)]
