"""The cheaper leak scan finds exactly what the plain one did, and what it remembers clean is re-read
once changed.

vault.runner.needle_scan answers `any(n in window for n in needles)` in fewer passes (needles
holding another dropped, case forms searched in the lower-cased window, a credential's fragments
only in runs of its characters) and remembers the files an agent's end found clean by (device,
inode, size, mtime, ctime), so the trial's end does not read them again.
"""

from __future__ import annotations

import gzip
import os
import random
import secrets
import time
from collections import Counter
from pathlib import Path

import pytest

from vault.runner import bypass, collect, needle_scan, unpack

KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtz\n"
       "c2gtZWQyNTUxOQAAACDx2Zq0b6m0Y3k9lqQWm1m6wq6Yx0v8nF5s3Hq9Qm9R0QAAAJgq\n-----END OPENSSH PRIVATE KEY-----\n")


def _tokens() -> list[str]:
    return ["vsk_" + secrets.token_urlsafe(24), "vsc_" + secrets.token_urlsafe(24), "short-pw", KEY]


def _naive(needles: list[bytes], window: bytes) -> bool:
    return any(n in window for n in needles)


def _near_misses(n: bytes, rnd: random.Random) -> list[bytes]:
    """A needle's neighbours that are not it: one byte short, one case flipped, one byte changed."""
    i = rnd.randrange(len(n))
    flipped = n[:i] + n[i:i + 1].swapcase() + n[i + 1:]
    changed = n[:i] + bytes([(n[i] + 1) % 256]) + n[i + 1:]
    return [n[1:], n[:-1], flipped, changed]


def test_the_matcher_answers_as_every_needle_searched_alone() -> None:
    """Each needle form, its near misses (a case flipped: hex and HEX are one pass, checked byte
    for byte), 11 and 12 characters of a credential, amid random and text-like filler."""
    rnd = random.Random(7)
    values = _tokens()
    needles = [n for v in values for n in bypass.leak_needles(v)]
    match = needle_scan.matcher(needles)
    alpha = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-=+/ \n,"
    fillers = [lambda k: rnd.randbytes(k), lambda k: bytes(rnd.choice(alpha) for _ in range(k))]
    raw = values[0].encode()
    probes = [*needles, raw[3:14], raw[3:15], raw[::-1][:12]]
    probes += [m for n in needles for m in _near_misses(n, rnd)]
    checked = hits = 0
    for probe in probes:
        for fill in fillers:
            window = fill(rnd.randrange(0, 200)) + probe + fill(rnd.randrange(0, 200))
            assert match.found(window) == _naive(needles, window), probe
            checked, hits = checked + 1, hits + _naive(needles, window)
    assert hits >= 2 * len(needles) and checked - hits > len(needles)  # both answers were asked for


@pytest.mark.parametrize("bait", ["runs", "hits"])
def test_a_window_of_near_misses_falls_back_and_still_finds_the_needle(bait: str) -> None:
    """Past RUNS_MOST runs of a credential's characters, or HITS_MOST case-folded near misses, the
    rest of the window is searched needle by needle: a needle at its end is still found."""
    token = "vsk_" + secrets.token_urlsafe(24)
    needles = bypass.leak_needles(token)
    match = needle_scan.matcher(needles)
    if bait == "runs":  # 12 of its characters that are no fragment of it: a run looked at, then the rest
        unit = next(u for c in token[4:] if (u := (token[4:15] + c).encode()) not in token.encode()) + b"\n"
        assert match.runs and needle_scan.RUNS_MOST * len(unit) < 1 << 20
        body = unit * (needle_scan.RUNS_MOST + 10)
        fragment = token[10:22].encode()
    else:  # its spaced hex, each with one letter's case flipped: hits of the lowered window, none a needle
        spaced = " ".join(f"{b:02x}" for b in token.encode())
        at = next(i for i, c in enumerate(spaced) if c.isalpha())
        assert spaced.encode() in match.rest.folded
        unit = (spaced[:at] + spaced[at].upper() + spaced[at + 1:]).encode() + b"\n"
        body = unit * (needle_scan.HITS_MOST + 10)
        fragment = spaced.upper().encode()
    assert not match.found(body) and not _naive(needles, body)
    assert match.found(body + fragment) and _naive(needles, body + fragment)


def test_a_window_of_many_runs_is_searched_for_every_credentials_anchors() -> None:
    """A trial beside others scans for 24 credentials' needles (their covers built per credential and
    joined): lines of base64 (past ANCHOR_AFTER runs, so only the anchors are searched first), then
    each credential's fragment, each long form, or a near miss of one at the end: found exactly as
    every needle searched alone."""
    rnd = random.Random(11)
    values = ["vsk_" + secrets.token_urlsafe(24) for _ in range(23)] + [KEY]
    parts = [needle_scan.part(tuple(bypass.leak_needles(v))) for v in values]
    needles = [n for p in parts for n in p]
    match = needle_scan.matcher(needles)
    assert any(r.anchors for r in match.runs)  # the anchors' path is the one taken
    lines = b"".join(secrets.token_urlsafe(rnd.randrange(20, 60)).encode() + b"\n"
                     for _ in range(needle_scan.ANCHOR_AFTER * 4))
    assert not match.found(lines) and not _naive(needles, lines)
    for v in values[::5]:
        raw = v.encode()
        for probe in [raw[5:17], raw[-12:], *(n for n in bypass.leak_needles(v) if len(n) > 40)]:
            for tail in (probe, *_near_misses(probe, rnd)):
                window = lines + tail + b"\n"
                assert match.found(window) == _naive(needles, window), (v[:6], tail[:20])


def test_each_needle_form_across_two_chunks_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every form of a one-line credential and of a key's line, split at every few bytes across the
    read chunks' boundary, and inside a gzip stream across the decompressor's output chunks."""
    monkeypatch.setattr(collect, "SCAN_CHUNK", 4096)
    monkeypatch.setattr(unpack, "SCAN_CHUNK", 4096)
    values = [_tokens()[0], KEY]
    needles = [n for v in values for n in bypass.leak_needles(v)]
    path = tmp_path / "f"
    for n in dict.fromkeys(needles):
        for cut in sorted({1, len(n) // 2, len(n) - 1}):
            path.write_bytes(b"." * (4096 - cut) + n + b"." * 64)
            assert collect.leak_window(path, needles), (n, cut)
            unpack.start()
            path.write_bytes(gzip.compress(b"." * (4096 - cut) + n + b"." * 64))
            assert collect.leak_window(path, needles), (n, cut, "gzip")
    path.write_bytes(b"." * 10_000)
    assert not collect.leak_window(path, needles)


def _settled(path: Path) -> None:
    """Wait (polled, bounded) until a change made now gets a ctime other than `path`'s: ctime is
    stamped from a coarse clock tick."""
    was = path.stat().st_ctime_ns
    probe = path.with_name(path.name + ".tick")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        probe.write_bytes(b"")
        if probe.stat().st_ctime_ns > was:
            return
    raise AssertionError("the clock's tick never moved on")


@pytest.fixture
def remembered(monkeypatch: pytest.MonkeyPatch) -> needle_scan.Clean:
    """A trial's Clean whose scans begin well after any file's last change (SETTLE_NS)."""
    monkeypatch.setattr(needle_scan.Clean, "now", staticmethod(lambda: time.time_ns() + 10 ** 10))
    return needle_scan.Clean()


def test_an_unchanged_clean_file_is_not_read_again(tmp_path: Path, remembered: needle_scan.Clean,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    needles = bypass.leak_needles("vsk_" + secrets.token_urlsafe(24))
    path = tmp_path / "state.json"
    path.write_bytes(b"{}" * 1000)
    assert collect.leak_window(path, needles, remembered) == b"" and len(remembered) == 1

    def read(*args: object) -> bytes:
        raise AssertionError("read again")
    monkeypatch.setattr(collect, "_scan", read)
    assert collect.leak_window(path, needles, remembered) == b""
    other = bypass.leak_needles("vsk_" + secrets.token_urlsafe(24))  # another trial's set: read
    with pytest.raises(AssertionError, match="read again"):
        collect.leak_window(path, other, remembered)


@pytest.mark.parametrize("how", ["same size, mtime put back", "renamed over", "appended"])
def test_a_file_changed_after_its_clean_scan_is_read_again(tmp_path: Path, remembered: needle_scan.Clean,
                                                          how: str) -> None:
    token = "vsk_" + secrets.token_urlsafe(24)
    needles = bypass.leak_needles(token)
    path = tmp_path / "state.json"
    clean = b"x" * len(token) + b"\n" + b"y" * 100
    path.write_bytes(clean)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert collect.leak_window(path, needles, remembered) == b"" and len(remembered) == 1
    before = path.stat()
    _settled(path)
    if how == "same size, mtime put back":  # rewritten in place, then `touch -d` back
        with open(path, "r+b") as f:
            f.write(token.encode())
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = path.stat()
        assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
        assert after.st_ctime_ns != before.st_ctime_ns  # what keeps it from passing as the same file
    elif how == "renamed over":
        new = tmp_path / "new"
        new.write_bytes(token.encode() + clean[len(token):])
        os.utime(new, ns=(before.st_atime_ns, before.st_mtime_ns))
        os.replace(new, path)
    else:
        with open(path, "ab") as f:
            f.write(token.encode())
    assert token.encode() in collect.leak_window(path, needles, remembered)


def test_a_file_changed_just_before_its_scan_or_during_it_is_not_remembered(tmp_path: Path) -> None:
    """Within SETTLE_NS of its last change a same-tick rewrite would keep its ctime: not remembered."""
    needles = bypass.leak_needles("vsk_" + secrets.token_urlsafe(24))
    path = tmp_path / "fresh"
    path.write_bytes(b"z" * 100)
    seen = needle_scan.Clean()
    assert collect.leak_window(path, needles, seen) == b"" and len(seen) == 0
    st = path.stat()
    match = needle_scan.matcher(needles)
    later = os.stat_result((*st[:6], st.st_size + 1, *st[7:]))  # its size changed while read
    seen.add(st, later, time.time_ns() + 10 ** 10, match)
    assert len(seen) == 0


def test_a_compressed_file_cut_by_the_budget_is_not_remembered(tmp_path: Path, remembered: needle_scan.Clean,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    token = "vsk_" + secrets.token_urlsafe(24)
    needles = bypass.leak_needles(token)
    path = tmp_path / "cache.gz"
    path.write_bytes(gzip.compress(b"." * (10 << 20) + token.encode()))
    monkeypatch.setattr(unpack, "UNPACK_MOST", 1 << 20)
    unpack.start()
    assert collect.leak_window(path, needles, remembered) == b"" and unpack.cut() == ["cache.gz"]
    assert len(remembered) == 0  # the trial's end reads it again, with its own budget
    monkeypatch.setattr(unpack, "UNPACK_MOST", 64 << 20)
    unpack.start()
    assert token.encode() in collect.leak_window(path, needles, remembered)


def test_large_windows_of_many_runs_answer_as_the_plain_search() -> None:
    """Windows long enough for every fallback (many runs of base64's letters, of printable ASCII),
    each with one needle of one of five credentials (or none) at a random place."""
    rnd = random.Random(11)
    values = [*("vsk_" + secrets.token_urlsafe(24) for _ in range(5)), KEY]
    needles = [n for v in values for n in bypass.leak_needles(v)]
    match = needle_scan.matcher(needles)
    ids = [secrets.token_urlsafe(rnd.randint(6, 40)).encode() for _ in range(300)]
    for i in range(40):
        body = b"".join(rnd.choice(ids) + rnd.choice([b" ", b"\n", b",", b""]) for _ in range(6000))
        at = rnd.randrange(len(body))
        window = body[:at] + (rnd.choice(needles) if i % 4 else b"") + body[at:]
        assert match.found(window) == _naive(needles, window), i


def test_lines_of_one_letter_are_searched_by_anchors_and_answer_as_the_plain_search() -> None:
    """A hostile agent's output held its trial's grading: lines of one letter are all runs, and
    each run was searched for each needle (0.65 s of CPU per 4 MiB with five credentials). Past
    a few runs the rest of such a window is first searched for a few anchors, one of which every
    needle of a group holds; a needle (or a near miss of one) anywhere in it answers as before."""
    rnd = random.Random(12)
    values = ["vsk_" + secrets.token_urlsafe(24) for _ in range(5)]
    needles = [n for v in values for n in bypass.leak_needles(v)]
    match = needle_scan.matcher(needles)
    anchored = [r for r in match.runs if r.anchors is not None]
    assert anchored, "no group has anchors"
    for r in anchored:
        assert all(any(a in n for a in r.anchors) for n in r.needles)
    line = b"x" * 1023 + b"\n"
    for i in range(60):
        body = line * rnd.randint(40, 400)
        n = rnd.choice(needles)
        if i % 3 == 1:
            cut = rnd.randrange(len(n))
            n = n[:cut] + n[cut + 1:]  # a near miss
        at = rnd.randrange(len(body))
        window = body[:at] + (n if i % 3 != 2 else b"") + body[at:]
        assert match.found(window) == _naive(needles, window), i


def _pairwise_minimal(needles: tuple[bytes, ...]) -> list[bytes]:
    """The definition `_minimal` keeps to: shortest first, each once, none holding a kept one."""
    out: list[bytes] = []
    for n in sorted(dict.fromkeys(needles), key=len):
        if not any(k in n for k in out):
            out.append(n)
    return out


def test_needles_holding_another_are_dropped_as_by_checking_every_pair() -> None:
    """The index of the kept needles' first bytes drops the same needles as checking every pair:
    the forms of many credentials that share their first bytes ("vsk_" in hex, base64), shorter
    needles than the index's key, the empty needle, bytes of any value."""
    rnd = random.Random(19)
    many = tuple(n for v in [*_tokens(), *_tokens(), *_tokens()] for n in bypass.leak_needles(v))
    assert needle_scan._minimal(many) == _pairwise_minimal(many)
    for round_ in range(300):
        alphabet = rnd.choice([b"ab", b"ab\x00c", b"AB+/x", bytes(range(256))])
        needles = tuple(bytes(rnd.choice(alphabet) for _ in range(rnd.randint(0 if round_ % 50 == 0 else 1, 40)))
                        for _ in range(rnd.randint(1, 60)))
        assert needle_scan._minimal(needles) == _pairwise_minimal(needles), needles


def test_a_piece_is_grouped_under_a_needle_that_holds_it() -> None:
    """A credential's fragments are grouped under a long needle holding them (its own, amid other
    credentials' forms); a piece no long needle holds has no home, and a hit across two joined
    needles is not taken for one."""
    many = tuple(n for v in [*_tokens(), *_tokens()] for n in bypass.leak_needles(v))
    homes = needle_scan._Homes(many)
    longs = [n for n in many if len(n) > needle_scan.PIECE_MOST]
    for i, n in enumerate(many):
        if len(n) <= needle_scan.PIECE_MOST:
            home = homes.holding(n, i)
            assert (home is None) == (not any(n in b for b in longs)), n
            assert home is None or n in home
    a, b = b"x" * 20 + b"AAAAAAAAAAAA", b"BBBBBBBBBBBB" + b"y" * 20
    across = needle_scan._Homes((a, b))
    assert across.holding(b"AAAAAABBBBBB", 2) is None
    assert across.holding(b"BBBBBBy", 2) == b


def test_a_set_built_from_remembered_parts_answers_as_every_needle_searched_alone() -> None:
    """A trial beside others scans for its own and its neighbours' credentials: the matcher is
    built from each credential's remembered part. Parts in any order, one given twice, one cut
    short, needles of no part between them, and one credential's needle that also lies in
    another's part: the answers are the plain search's."""
    rnd = random.Random(23)
    parts = [bypass.leak_needles(v) for v in [*_tokens(), *_tokens()]]
    loose = [b"loose-needle-not-a-part", parts[0][3]]  # the second also lies in a part
    needles = [*parts[1], *loose[:1], *parts[0], *parts[4][:7], *parts[1], *loose[1:], *parts[5], *parts[2]]
    assert len(needle_scan._split(tuple(needles))) >= 5  # built from parts (and one of the rest)
    match = needle_scan.matcher(needles)
    alpha = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-=+/ \n,"
    everything = [n for p in parts for n in p] + loose
    hits = 0
    for probe in everything + [m for n in everything[::7] for m in _near_misses(n, rnd)]:
        for fill in (rnd.randbytes, lambda k: bytes(rnd.choice(alpha) for _ in range(k))):
            window = fill(rnd.randrange(0, 120)) + probe + fill(rnd.randrange(0, 120))
            assert match.found(window) == _naive(needles, window), probe
            hits += _naive(needles, window)
    assert 0 < hits < 2 * len(everything)  # credentials outside the set (parts 3, 4's rest) were probed too


def test_a_set_changed_by_one_credential_builds_only_its_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each credential's part is built once (why: the set changes each time a neighbour trial
    starts or ends), and no anchors are made until a window of many runs needs them (made for
    every open trial's needles with each matcher, they made `make run` 7x slower); a matcher of the
    changed set still finds the old credentials and the new."""
    values = ["vsk_" + secrets.token_urlsafe(24) for _ in range(6)]
    before = [n for v in values[:5] for n in bypass.leak_needles(v)]
    needle_scan.matcher(before)
    built = needle_scan._part.cache_info().misses
    covered: list[int] = []
    made = needle_scan._anchors
    monkeypatch.setattr(needle_scan, "_anchors", lambda ns: covered.append(len(ns)) or made(ns))
    after = [n for v in values[1:] for n in bypass.leak_needles(v)]
    match = needle_scan.matcher(after)
    assert needle_scan._part.cache_info().misses == built + 1
    assert covered == []
    assert match.found(b"x " + values[5][5:17].encode() + b" y") and match.found(values[1].encode())
    assert not match.found(values[0].encode())


def test_short_runs_looked_up_by_their_slices_answer_as_the_plain_search() -> None:
    """A run is looked up by its slices where a length's needles outnumber them (a trial beside
    others: hundreds of 12-character fragments), else searched for each needle: runs of every
    length around that turn, needles at a run's start, end and middle, near misses."""
    rnd = random.Random(29)
    values = ["vsk_" + secrets.token_urlsafe(24) for _ in range(12)]
    needles = [n for v in values for n in bypass.leak_needles(v)]
    runs = needle_scan._Runs([n for n in needles if set(n) <= needle_scan.WORD])
    assert any(2 * len(ns) > 500 for _, _, ns in runs.lengths)  # the lookup is taken
    alpha = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
    asked = Counter()
    for _ in range(3000):
        size = rnd.choice([1, 5, 11, 12, 13, 40, 200, 260, 300, 600, 3000])
        run = bytearray(rnd.choice(alpha) for _ in range(size))
        if rnd.random() < 0.5:
            n = rnd.choice(runs.needles)
            n = n if rnd.random() < 0.7 else rnd.choice(_near_misses(n, rnd))
            at = rnd.choice([0, max(0, size - len(n)), rnd.randrange(size)])
            run[at:at + len(n)] = n
        window = b" " + bytes(run) + b" \n"
        expected = _naive(runs.needles, window)
        assert runs.found(window) == expected, window
        asked[expected] += 1
    assert asked[True] > 500 and asked[False] > 500
