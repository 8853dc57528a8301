"""Is any of the leak scan's needles in a window? The same answer as `any(n in w for n in needles)`, cheaper.

Why: after the thirteenth red-team pass a credential has ~74 needle forms (vault.runner.bypass.
leak_needles), half of them its 12-character fragments, and each `n in w` is a pass over the
window: five credentials cost ~300 ms of CPU per 4 MiB here. Three things cut the passes, each exact
(every candidate is checked against the needles themselves, byte for byte):

* a needle holding another needle is dropped (where it is, the shorter one is too);
* needles equal once lower-cased (hex and HEX, `\\x76` and `\\X76`, base32 in either case) are
  one pass over the lower-cased window, each hit checked against the window itself;
* the short needles that are pieces of one longer needle (a credential's fragments), and the
  long needles by alphabet (base64's letters; printable ASCII but the space; the rest), are
  looked for only inside runs of the window made of their characters alone (one `translate`,
  then a find of a run as long as the shortest of them); one mask over base64's letters gates
  every group written in them. Dense data has next to no such runs, text few but of the first.
  Past RUNS_MOST runs in one window (lines of base64) its rest is searched as before.

A window of 256 KiB or more (an agent's output, a file it left) is first looked up by its
needles' 8-byte grams, one set lookup per 4 bytes whatever the needles (vault.runner.needle_grams),
and searched as above only in the parts where one is: when it has GRAMS_NEEDLES needles or more,
or few distinct bytes (lines of one letter, where each `n in w` compares at nearly every byte).

The first two are built per credential (`part`: the forms vault.runner.bypass.leak_needles made
for one value, cached) and the parts' results joined: a trial beside others scans for every open
trial's credentials, a set that changes each time a trial starts or ends, and rebuilding all of it
each time was the runner's top cost at `--jobs 4` and more. A needle of one credential is not
checked against another's (random values of 20+ characters hold no form of each other, and a
needle kept that another holds costs a pass, never an answer).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable
import hashlib
import heapq
import os
import threading
import time

from vault.runner import needle_grams

PIECE_MOST = 23  # a needle this short or shorter that lies in a longer one is searched as its piece
PIECES_LEAST = 4  # fewer pieces of one needle than this: their own passes are as cheap as a run mask
RUNS_MOST = 1024  # runs looked at in one window before its rest is searched piece by piece
WORD = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_")
PRINTABLE = frozenset(range(0x21, 0x7f))  # but the space: text's runs of these are its words, not its lines
GATE_RUNS_MOST = 16  # the same, for the mask over all of them: text has many such runs, dense data next to none
HITS_MOST = 64  # hits of a lower-cased needle checked one by one before its forms are searched whole


class _Plain:
    """Needles searched in the window itself; those equal once lower-cased (hex and HEX) in one pass
    over the lower-cased window, each hit checked against the window."""

    def __init__(self, needles: list[bytes]) -> None:
        folded: dict[bytes, list[bytes]] = {}
        for n in needles:
            folded.setdefault(n.lower(), []).append(n)
        self.plain = [forms[0] for forms in folded.values() if len(forms) == 1]
        self.folded = {k: forms for k, forms in folded.items() if len(forms) > 1}

    def found(self, window: bytes) -> bool:
        if any(n in window for n in self.plain):
            return True
        if self.folded:
            lowered = window.lower()  # the same length: a hit's offset is the window's
            return any(_folded_hit(window, lowered, k, forms) for k, forms in self.folded.items())
        return False


class _Runs:
    """Needles written in few characters, looked for only in the window's runs of those characters
    at least as long as the shortest of them (one translate, then a find of such a run)."""

    def __init__(self, needles: list[bytes], rest: Callable[[bytes], bool] | None = None,
                 most: int = RUNS_MOST) -> None:
        self.needles, self.most = needles, most
        chars = set(b"".join(needles))
        self.word = chars <= WORD
        self.table = bytes(1 if b in chars else 0 for b in range(256))
        self.least = min(len(p) for p in needles)
        self.run = b"\x01" * self.least
        self._rest = rest  # what searches the rest of a window of many runs; made when first needed
        # the needles by length (_in)
        lengths: dict[int, list[bytes]] = {}
        for n in needles:
            lengths.setdefault(len(n), []).append(n)
        self.lengths = [(size, frozenset(ns), ns) for size, ns in sorted(lengths.items())]
        self._anchors: list[bytes] | None | object = ...  # made when a window of many runs first needs them

    @property
    def anchors(self) -> list[bytes] | None:
        """`_anchors` of the needles, made on first use: only a window of many runs (an agent's
        lines of one letter, of base64) asks, and a trial beside others builds a matcher each time
        the set of open trials' credentials changes. Two threads making it at once make the same."""
        if self._anchors is ...:
            self._anchors = _anchors(self.needles)
        return self._anchors  # type: ignore[return-value]

    def rest(self, window: bytes) -> bool:
        if self._rest is None:
            self._rest = _Plain(self.needles).found
        return self._rest(window)

    def found(self, window: bytes) -> bool:
        mask = window.translate(self.table)
        pos, runs = 0, 0
        while (start := mask.find(self.run, pos)) >= 0:
            runs += 1
            # many runs: if no anchor lies in the rest, no needle does (dense data never gets here)
            if runs == ANCHOR_AFTER and self.anchors is not None \
                    and not any(window.find(a, start) >= 0 for a in self.anchors):
                return False
            if runs > self.most:  # many runs (lines of text, of base64): the rest searched whole
                return self.rest(window[start:])
            end = mask.find(b"\0", start + self.least)
            end = len(window) if end < 0 else end
            if self._in(window[start:end]):
                return True
            pos = end
        return False

    def _in(self, seg: bytes) -> bool:
        """Does the run `seg` hold a needle? Needles of one length that outnumber the run's slices
        of that length (a credential's fragments, in a short run) are looked up by those slices,
        one hash each (a slice costs about two searches); the others are searched for each."""
        for size, grams, needles in self.lengths:
            slices = len(seg) - size + 1
            if slices <= 0:
                break  # the longer needles cannot lie in it either
            if 2 * slices <= len(needles):
                if any(seg[i:i + size] in grams for i in range(slices)):
                    return True
            elif any(p in seg for p in needles):
                return True
        return False


ANCHOR = 4  # bytes in an anchor (_anchors): random letters repeat one in 64**4 places
ANCHOR_AFTER = 32  # runs of one window looked at one by one before its rest is searched for anchors


def _anchors(needles: list[bytes]) -> list[bytes] | None:
    """A few ANCHOR-byte strings, one of them in every needle (a greedy cover; a credential's
    fragments share most of theirs): a window holding none of them holds no needle, found in a
    pass each. None where that is no fewer passes than half the needles.

    Why: a window of many runs (lines of one letter, of base64) was searched run by run, each
    needle in each: 0.5 s of CPU per MiB with five credentials' needles, so an agent printing
    gigabytes held its trial's grading for many minutes. Only such a window is searched for them
    (`_Runs.found`): in dense data or text, with few runs, the run masks cost less.

    Each greedy step takes the gram in the most needles not yet covered from a heap, a stale count
    pushed back when popped: linear in the needles' grams (times a log). Recounting every gram at
    each step was quadratic in the needles: built for every open trial's credentials with each
    matcher, 1.5 s of the runner's CPU for 20 credentials and 25 s for 160, several times a trial
    (`make run` went from 14 s to 100 s and more)."""
    if not needles or min(len(n) for n in needles) < ANCHOR:
        return None
    grams = [{n[i:i + ANCHOR] for i in range(len(n) - ANCHOR + 1)} for n in needles]
    holders: dict[bytes, list[int]] = {}
    for i, gs in enumerate(grams):
        for g in gs:
            holders.setdefault(g, []).append(i)
    count = {g: len(held) for g, held in holders.items()}
    heap = [(-c, g) for g, c in count.items()]  # the most needles first; ties by value (the same every run)
    heapq.heapify(heap)
    covered = [False] * len(needles)
    left, out = len(needles), list[bytes]()
    while left:
        if 2 * (len(out) + 1) > len(needles):
            return None
        while True:
            c, best = heapq.heappop(heap)
            if -c == count[best]:
                break
            heapq.heappush(heap, (-count[best], best))  # its count fell since it was pushed
        out.append(best)
        for i in holders[best]:
            if not covered[i]:
                covered[i] = True
                left -= 1
                for g in grams[i]:
                    count[g] -= 1
    return out


class _Part:
    """One credential's needles pruned (`_minimal`) and its pieces grouped under their homes:
    `runs`, a run mask per group of PIECES_LEAST or more; `rest`, the others."""

    def __init__(self, needles: tuple[bytes, ...]) -> None:
        self.ident = hashlib.sha256(b"".join(b"%d:%s" % (len(n), n) for n in sorted(set(needles)))).digest()
        self.kept = kept = _minimal(needles)
        # the needle a piece lies in may itself be dropped (it holds its pieces): any needle is a home
        homes = _Homes(needles)
        place: dict[bytes, int] = {}
        for i, n in enumerate(needles):
            place.setdefault(n, i)
        groups: dict[bytes, list[bytes]] = {}
        rest: list[bytes] = []
        for n in kept:
            home = homes.holding(n, place[n]) if len(n) <= PIECE_MOST else None
            if home is not None:
                groups.setdefault(home, []).append(n)
            else:
                rest.append(n)
        self.runs = [_Runs(g) for g in groups.values() if len(g) >= PIECES_LEAST]
        self.rest = rest + [n for g in groups.values() if len(g) < PIECES_LEAST for n in g]
        # which alphabets each long needle of the rest is written in (Matcher groups them by it)
        self.alphabets = {n: (set(n) <= WORD) | (set(n) <= PRINTABLE) << 1 | (0 in n) << 2
                          for n in self.rest if len(n) > PIECE_MOST}


@functools.lru_cache(maxsize=1024)
def _part(needles: tuple[bytes, ...]) -> _Part:
    return _Part(needles)


PARTS_MOST = 4096  # credentials' forms remembered by `part` (a run's, and its neighbours')
_PARTS: dict[bytes, tuple[bytes, ...]] = {}  # by each one's first needle (the value itself)
_PARTS_LOCK = threading.Lock()  # trials end in threads of their own


def part(needles: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """Remember `needles` as one credential's forms (vault.runner.bypass.leak_needles): a needle
    list holding them in a row is built from its parts (module doc). Returns them as given."""
    if needles and _PARTS.get(needles[0]) is not needles:
        with _PARTS_LOCK:
            if len(_PARTS) >= PARTS_MOST:
                _PARTS.pop(next(iter(_PARTS)), None)
            _PARTS[needles[0]] = needles
    return needles


def _split(needles: tuple[bytes, ...]) -> list[tuple[bytes, ...]]:
    """`needles` as the remembered parts they hold in a row (`part`), and one of the rest. Any
    split answers the same; one along the parts reuses their builds."""
    parts: list[tuple[bytes, ...]] = []
    loose: list[bytes] = []
    i, size = 0, len(needles)
    while i < size:
        known = _PARTS.get(needles[i])
        if known is not None and needles[i:i + len(known)] == known:
            parts.append(known)
            i += len(known)
        else:
            loose.append(needles[i])
            i += 1
    if loose:
        parts.append(tuple(loose))
    return list(dict.fromkeys(parts))


GRAMS_WINDOW = 1 << 18  # a window this large is first looked up by its grams (needle_grams) ...
GRAMS_NEEDLES = 200  # ... when its needles are this many (three credentials'): fewer cost less searched,
FEW_BYTES = 8  # ... or when its sample holds this few distinct bytes: bytes.find compares at nearly every
SAMPLE_STEP = 4099  # byte of such a window (lines of one letter: ~5 ms per 4 MiB a needle, not ~0.5)
GRAMS_LEAST_NEEDLES = 8  # fewer needles than this are searched one by one all the same


class Matcher:
    """`found(window)` is `any(n in window for n in needles)`."""

    def __init__(self, needles: tuple[bytes, ...]) -> None:
        built = [_part(p) for p in _split(needles)]
        kept = list(dict.fromkeys(n for p in built for n in p.kept))
        self.by_grams = len(kept) >= GRAMS_NEEDLES
        self.some_grams = len(kept) >= GRAMS_LEAST_NEEDLES
        self.short = _Plain([n for n in kept if len(n) < needle_grams.GRAM_LEAST])
        self.widest = max((len(n) for n in kept), default=0)
        self.long = [n for n in kept if len(n) >= needle_grams.GRAM_LEAST]
        # names the needle set in Clean: a file clean of one set is not clean of another (the same
        # set split otherwise is named otherwise: its files are read again, no more)
        self.ident = (built[0].ident if len(built) == 1
                      else hashlib.sha256(b"".join(sorted(p.ident for p in built))).digest())
        self.runs = [r for p in built for r in p.runs]
        rest = list(dict.fromkeys(n for p in built for n in p.rest))
        alphabets: dict[bytes, int] = {}
        for p in built:
            alphabets.update(p.alphabets)
        # the long needles by alphabet: base64's letters (the value, base64, base32, hex, reversed,
        # rot13), printable ASCII but the space (base85, escapes, byte lists), the rest (UTF-16 and
        # the forms with spaces): a run mask each; dense data has no run of one that long, text
        # has few but of the first
        for bit in (1, 2, 4):  # WORD, PRINTABLE, holding a NUL (_Part.alphabets)
            group = [n for n in rest if alphabets.get(n, 0) & bit]
            if len(group) >= PIECES_LEAST:
                self.runs.append(_Runs(group))
                taken = set(group)
                rest = [n for n in rest if n not in taken]
        self.rest = _Plain(rest)
        # one mask over base64's letters for all the groups written in them (a credential's
        # fragments, its long forms): in dense data their runs are few and short
        word = [r for r in self.runs if r.word]
        gated = {id(r) for r in word}
        self.runs = [r for r in self.runs if id(r) not in gated]
        if word:
            self.runs.append(_Runs([n for r in word for n in r.needles],
                                   lambda w: any(r.found(w) for r in word), GATE_RUNS_MOST))

    def found(self, window: bytes) -> bool:
        if len(window) >= GRAMS_WINDOW and (self.by_grams or self.some_grams
                                             and len(set(window[::SAMPLE_STEP])) <= FEW_BYTES):
            return self._by_grams(window)
        return self.rest.found(window) or any(r.found(window) for r in self.runs)

    def _by_grams(self, window: bytes) -> bool:
        """The same answer, searching only the parts of the window where a needle's 8 bytes are
        (needle_grams), each widened by the longest needle; the short needles in all of it."""
        table = _table(self.ident, self.long)
        if (self.short.plain or self.short.folded) and self.short.found(window):
            return True
        for start, end in needle_grams.suspects(window, table):
            part = window[max(0, start - self.widest):end + self.widest]
            if self.rest.found(part) or any(r.found(part) for r in self.runs):
                return True
        return False


TABLES_MOST = 4  # gram tables kept (~0.16 MB a credential): the matchers' cache holds 32 sets, and a
_TABLES: dict[bytes, frozenset[int]] = {}  # sweep beside others' would keep hundreds of MB
_TABLES_LOCK = threading.Lock()


def _table(ident: bytes, long: list[bytes]) -> frozenset[int]:
    """The grams of a matcher's long needles, by its ident: made when a large window first needs
    them (~4 ms a credential), the last few sets' kept."""
    with _TABLES_LOCK:
        table = _TABLES.pop(ident, None)
        if table is not None:
            _TABLES[ident] = table  # the newest again
            return table
    table = needle_grams.grams(long)  # two threads making it at once make the same
    with _TABLES_LOCK:
        _TABLES[ident] = table
        while len(_TABLES) > TABLES_MOST:
            _TABLES.pop(next(iter(_TABLES)))
    return table


def _folded_hit(window: bytes, lowered: bytes, key: bytes, forms: list[bytes]) -> bool:
    pos, hits, size = 0, 0, len(key)
    while (at := lowered.find(key, pos)) >= 0:
        hits += 1
        if hits > HITS_MOST:  # a window full of near misses: each form searched whole
            rest = window[at:]
            return any(f in rest for f in forms)
        if window[at:at + size] in forms:
            return True
        pos = at + 1
    return False


KEY = 12  # a kept needle is indexed by its first KEY bytes (_minimal)


def _minimal(needles: tuple[bytes, ...]) -> list[bytes]:
    """The needles without those holding another (shortest first, each once).

    Each needle is checked against those kept so far through an index of their first KEY bytes,
    looked up at each offset of the needle: linear in the needles' total length. Checking every
    pair was quadratic in their count, and a trial beside others scans for their credentials too
    (2,000 needles: 0.25 s of CPU each time the set changed, several times a trial)."""
    out: list[bytes] = []
    short: list[bytes] = []  # kept needles shorter than KEY, looked for whole
    index: dict[bytes, list[bytes]] = {}
    for n in sorted(dict.fromkeys(needles), key=len):
        if any(k in n for k in short) or _indexed_in(n, index):  # b"" (in every needle) keeps itself alone
            continue
        out.append(n)
        if len(n) < KEY:
            short.append(n)
        else:
            index.setdefault(n[:KEY], []).append(n)
    return out


def _indexed_in(n: bytes, index: dict[bytes, list[bytes]]) -> bool:
    """Does `n` hold a needle of `index` (each under its first KEY bytes)?"""
    get = index.get
    for i in range(len(n) - KEY + 1):
        ks = get(n[i:i + KEY])
        if ks is not None and any(n.startswith(k, i) for k in ks):
            return True
    return False


class _Homes:
    """`holding(piece, at)`: a long needle that holds `piece`, found by a search of all of them
    joined (a hit that spans two needles is passed over), not one search each: the nearest one
    given before position `at` of the needles (a fragment follows its own credential's forms),
    else the first. Which one it is only groups the pieces (Matcher); the answers are the same."""

    def __init__(self, needles: tuple[bytes, ...]) -> None:
        self.needles: list[bytes] = []
        self.places: list[int] = []  # each long needle's position among all the needles
        self.ends: list[int] = []  # and where it ends in `hay`
        seen: set[bytes] = set()
        end = 0
        for place, n in enumerate(needles):
            if len(n) > PIECE_MOST and n not in seen:
                seen.add(n)
                end += len(n)
                self.needles.append(n)
                self.places.append(place)
                self.ends.append(end)
        self.hay = b"".join(self.needles)

    def holding(self, piece: bytes, at: int) -> bytes | None:
        end = self.ends[i - 1] if (i := bisect.bisect_left(self.places, at)) else 0
        hit = self.hay.rfind(piece, 0, end)
        while hit >= 0:
            if (n := self._within(piece, hit)) is not None:
                return n
            hit = self.hay.rfind(piece, 0, hit + len(piece) - 1)
        hit = self.hay.find(piece)
        while hit >= 0:
            if (n := self._within(piece, hit)) is not None:
                return n
            hit = self.hay.find(piece, hit + 1)
        return None

    def _within(self, piece: bytes, hit: int) -> bytes | None:
        """The needle a hit at `hit` lies in wholly, if it does."""
        i = bisect.bisect_right(self.ends, hit)  # the needle the hit starts in
        return self.needles[i] if i < len(self.ends) and hit + len(piece) <= self.ends[i] else None


@functools.lru_cache(maxsize=32)
def _cached(needles: tuple[bytes, ...]) -> Matcher:
    return Matcher(needles)


def matcher(needles: list[bytes] | tuple[bytes, ...]) -> Matcher:
    """The matcher of `needles`, built once per set (a trial asks for the same set per file)."""
    return _cached(tuple(needles))


SETTLE_NS = 100_000_000  # a file changed this recently before its scan began is not remembered clean


class Clean:
    """Files a leak scan found clean in one trial, each by (device, inode, size, mtime, ctime).

    Why: each agent's files are scanned when it ends (a successor may empty them) and again at
    the trial's end; a file unchanged in between need not be read twice. ctime is in the key
    because no process can set it (utimensat sets mtime and atime; ctime moves to "now" on any
    write, truncate, chmod or rename), so a file rewritten to the same size with its mtime put
    back (`touch -d`) is read again. ctime is stamped from a coarse clock (a tick, 1-10 ms): a
    rewrite within the tick of the file's last change would keep it, so a file changed less than
    SETTLE_NS before its scan began is not remembered. A new inode (deleted and made again, or
    renamed over) has its own ctime. A file that changed while it was read is not remembered."""

    def __init__(self) -> None:
        self._seen: set[tuple[int, int, int, int, int, bytes]] = set()
        self._lock = threading.Lock()

    @staticmethod
    def now() -> int:
        return time.time_ns()

    @staticmethod
    def _key(st: os.stat_result, match: Matcher) -> tuple[int, int, int, int, int, bytes]:
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, match.ident)

    def holds(self, st: os.stat_result, match: Matcher) -> bool:
        """Was this file, as `st` says it is now, found clean of `match`'s needles?"""
        with self._lock:
            return self._key(st, match) in self._seen

    def add(self, before: os.stat_result, after: os.stat_result, began_ns: int, match: Matcher) -> None:
        """The file was found clean, read between `before` and `after` (fstat of the fd read)."""
        key = self._key(before, match)
        if key != self._key(after, match) or before.st_ctime_ns > began_ns - SETTLE_NS:
            return
        with self._lock:
            self._seen.add(key)

    def __len__(self) -> int:
        return len(self._seen)
