"""The leak scan of a credential split over several names: the names of each directory read one
after another.

Why: an agent wrote a credential in pieces of 8 characters as the names of empty files
(`/var/tmp/d/01-ghp_Zq81`, `/var/tmp/d/02-mW0xZq81`, ...) or as nested directories
(`/tmp/x/ghp_Zq81/mW0xZq81/...`) and passed: each name was searched alone and each piece is
shorter than a fragment. The names of a directory are joined in their natural order (`2` before
`10`) and in the order they were made (ctime), as they are and with what they all share (a
prefix, a suffix), a leading number and an extension left out; and each path is joined without
its slashes. The joins are searched as the names are (their encodings; compressed streams
written as text, vault.runner.packed).
"""

from __future__ import annotations

import contextlib
import os
import re

GROUP_MOST = 4096  # names of one directory joined
STATS_MOST = 20_000  # lstat calls for the order of making, per call
_NUMBER = re.compile(rb"^\d+[._ -]*")
_EXT = re.compile(rb"\.[A-Za-z0-9]{1,8}$")
_DIGITS = re.compile(rb"(\d+)")


def joins(entries: list[bytes]) -> list[bytes]:
    """The joins of the absolute paths among `entries` (link targets and attributes are passed over)."""
    groups: dict[bytes, list[bytes]] = {}
    out: list[bytes] = []
    for e in entries:
        if e.startswith(b"/") and b"\n" not in e:
            head, _, tail = e.rpartition(b"/")
            group = groups.setdefault(head, [])
            if len(group) < GROUP_MOST:
                group.append(tail)
            out.append(e.replace(b"/", b""))  # nested directories named by pieces
    stats = 0
    for head, group in groups.items():
        group = list(dict.fromkeys(group))
        if len(group) < 2:
            continue
        orders = [sorted(group, key=_natural)]
        if stats + len(group) <= STATS_MOST:
            stats += len(group)
            orders.append(sorted(group, key=lambda n: _made(head, n)))
        for names in orders:
            out += [b"".join(names), b"".join(_stripped(names)), b"".join(_bare(n) for n in names)]
    return out


def _natural(name: bytes) -> list[bytes]:
    # split on a capturing group: its numbers are at the odd places, compared as numbers
    return [p.lstrip(b"0").rjust(64, b"0") if i % 2 else p for i, p in enumerate(_DIGITS.split(name))]


def _made(head: bytes, name: bytes) -> tuple[int, int]:
    with contextlib.suppress(OSError):
        st = os.lstat(head + b"/" + name)
        return st.st_ctime_ns, st.st_ino
    return 0, 0


def _stripped(names: list[bytes]) -> list[bytes]:
    """The names without the prefix and suffix they all share (`part-000`, `.txt`)."""
    pre = os.path.commonprefix(names)
    suf = os.path.commonprefix([n[::-1] for n in names])
    cut = min(len(suf), min(len(n) for n in names) - len(pre))
    return [n[len(pre):len(n) - cut] for n in names]


def _bare(name: bytes) -> bytes:
    """A name without a leading number (`01-`) and an extension."""
    return _EXT.sub(b"", _NUMBER.sub(b"", name))
