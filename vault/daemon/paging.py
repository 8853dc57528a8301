"""Answers that list things come in pages, so no answer outgrows a frame.

A list the daemon holds (pending prompts, sessions, prompt statistics) can
grow past the 1 MiB line a client reads; one answer that large would lock
every new approver out. So such an answer holds at most PAGE_ITEMS items and
PAGE_BYTES of JSON, and says where the next page starts (`next`, an opaque
cursor, null on the last page). An item too large for a page on its own is
cut down by the caller's `shrink` (and says so) rather than left out.

    {"pending": [...], "next": "41"}   then   {"after": "41"}  ->  {"pending": [...], "next": null}
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable

from vault.daemon.limits import PAGE_BYTES, PAGE_ITEMS


def size_of(item: Any) -> int:
    return len(json.dumps(item, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8", "replace"))


def page(items: Iterable[tuple[int, Any]], limit: int | None = None, *, max_bytes: int = PAGE_BYTES,
         shrink: Callable[[Any, int], Any] | None = None) -> tuple[list[Any], int | None]:
    """Take items (position, item) in order until the page is full.

    Returns (items, position of the last one taken if more remain, else None)."""
    limit = min(limit or PAGE_ITEMS, PAGE_ITEMS)
    out: list[Any] = []
    used = 0
    last: int | None = None
    for pos, item in items:
        if len(out) >= limit:
            return out, last
        size = size_of(item)
        if size > max_bytes // 2 and shrink is not None:
            item = shrink(item, max_bytes // 2)
            size = size_of(item)
        if out and used + size > max_bytes:
            return out, last
        out.append(item)
        used += size
        last = pos
    return out, None


def cursor(value: str | None) -> int:
    """A cursor from a client: the position after which the page starts (0: the start)."""
    if not value:
        return 0
    try:
        return max(0, int(value))
    except ValueError:
        return 0


def trim_counts(report: dict[str, Any], budget: int, keep: int = 100) -> dict[str, Any]:
    """A stats entry cut to size: each table of counts keeps its `keep` largest entries."""
    out = dict(report)
    cut = False
    for k, v in report.items():
        if isinstance(v, dict) and len(v) > keep and all(isinstance(n, (int, float)) for n in v.values()):
            top = sorted(v.items(), key=lambda kv: (-kv[1], kv[0]))[:keep]
            out[k] = dict(top)
            cut = True
    if cut:
        out["truncated"] = f"tables of counts show their {keep} largest entries"
    return out
