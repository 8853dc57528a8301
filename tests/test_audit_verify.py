"""Offline verify: every way of damaging a log is named, with the right first bad seq."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit_fixtures import FakeClock, LogFiles, corrupt_ct, line_kinds, make_log, rechain
from vault.audit import verify
from vault.audit.keys import public_pem
from vault.errors import BadInput


@pytest.fixture
def small(tmp_path: Path) -> LogFiles:
    """7 small records, heads after seq 0 (first), 3, 6 (every 3) and none extra at close."""
    return make_log(tmp_path / "orig", [{"type": "lock", "n": i} for i in range(7)], head_every_records=3)


def expected_flip_outcome(kinds: list[tuple[str, int]], line_no: int, is_last_byte: bool) -> tuple[str, int]:
    """Where a flipped byte in line `line_no` must be reported."""
    kind, seq = kinds[line_no]
    if is_last_byte:  # the final newline: the log now ends in a torn line
        return "truncated", seq
    if kind == "record":
        return "tampered", seq
    prev_heads = [s for k, s in kinds[:line_no] if k == "head"]
    return "tampered", (prev_heads[-1] + 1) if prev_heads else 0


class TestIntact:
    def test_known_sequence_is_intact(self, small: LogFiles) -> None:
        """A log written and closed by the writer verifies intact, fully anchored."""
        report = verify(small.log)
        assert ("intact", 7, 6, 0, None) == (report.status, report.records, report.last_signed_seq,
                                             report.unanchored, report.first_bad_seq)

    def test_heads_where_documented(self, small: LogFiles) -> None:
        """Heads follow the first record, every N records, and the last record at close."""
        heads = [s for k, s in line_kinds(small.lines()) if k == "head"]
        assert [0, 3, 6] == heads

    def test_empty_log_is_intact(self, tmp_path: Path) -> None:
        """A log opened and closed without records is intact with zero records."""
        files = make_log(tmp_path, 0)
        report = verify(files.log)
        assert ("intact", 0) == (report.status, report.records)

    def test_reopened_log_is_intact(self, small: LogFiles) -> None:
        """A second writer session continues the chain; the whole log verifies."""
        with small.writer(clock=FakeClock(1_800_000_000.0)) as w:
            assert 7 == w.append_sync({"type": "lock", "by": "bob"})
        report = verify(small.log)
        assert ("intact", 8, 7) == (report.status, report.records, report.last_signed_seq)

    def test_live_writer_tail_is_unanchored(self, tmp_path: Path) -> None:
        """Records after the last signed head (a live or crashed writer) are reported unanchored,
        never intact, with the first unsigned seq; once the writer signs them, intact."""
        files = make_log(tmp_path, 0)
        w = files.writer(head_every_records=100, head_every_seconds=1e9, clock=FakeClock())
        try:
            for i in range(5):
                w.append_sync({"type": "intent", "n": i})
            report = verify(files.log)
            assert ("unanchored", 5, 0, 4, 1) == (report.status, report.records, report.last_signed_seq,
                                                  report.unanchored, report.first_bad_seq)
            assert not report.intact
            assert "4 records after it are not yet anchored" in report.message
        finally:
            w.close()
        assert (0, "intact") == (verify(files.log).unanchored, verify(files.log).status)


class TestEveryByte:
    @pytest.mark.parametrize("mask", [0x01, 0xFF], ids=["low-bit", "all-bits"])
    def test_every_single_byte_flip_is_caught(self, small: LogFiles, tmp_path: Path, mask: int) -> None:
        """Flipping any one byte of the log gives tampered/truncated at the line's seq, never intact."""
        data = small.log.read_bytes()
        kinds = line_kinds(small.lines())
        starts = [0]
        for i, b in enumerate(data):
            if b == 0x0A:
                starts.append(i + 1)
        copy = small.copy_to(tmp_path / "copy")
        misses = []
        for off in range(len(data)):
            line_no = max(i for i, s in enumerate(starts) if s <= off)
            flipped = bytearray(data)
            flipped[off] ^= mask
            copy.log.write_bytes(bytes(flipped))
            report = verify(copy.log)
            want = expected_flip_outcome(kinds, line_no, off == len(data) - 1)
            if (report.status, report.first_bad_seq) != want:
                misses.append((off, want, report.status, report.first_bad_seq, report.message))
        assert [] == misses

    @pytest.mark.parametrize("replacement", [b" ", b"\r", b"\t", b"x", b"\x00"],
                             ids=["space", "cr", "tab", "letter", "nul"])
    def test_every_newline_replaced_is_caught(self, small: LogFiles, tmp_path: Path,
                                              replacement: bytes) -> None:
        """A line ending replaced by whitespace or anything else (lines merged) is caught."""
        data = small.log.read_bytes()
        kinds = line_kinds(small.lines())
        copy = small.copy_to(tmp_path / "copy")
        got = []
        for line_no, off in enumerate(i for i, b in enumerate(data) if b == 0x0A):
            copy.log.write_bytes(data[:off] + replacement + data[off + 1:])
            report = verify(copy.log)
            want = expected_flip_outcome(kinds, line_no, off == len(data) - 1)
            got.append(((report.status, report.first_bad_seq), want))
        assert [w for _, w in got] == [g for g, _ in got]

    def test_every_byte_of_the_head_file_is_caught(self, small: LogFiles, tmp_path: Path) -> None:
        """Flipping any byte of audit.head makes verify say tampered."""
        copy = small.copy_to(tmp_path / "copy")
        data = small.head.read_bytes()
        statuses = set()
        for off in range(len(data)):
            flipped = bytearray(data)
            flipped[off] ^= 0x01
            copy.head.write_bytes(bytes(flipped))
            statuses.add(verify(copy.log).status)
        assert {"tampered"} == statuses

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def test_random_byte_rewrites_are_caught(self, small: LogFiles, tmp_path: Path, data: st.DataObject) -> None:
        """Any byte set to any other value, anywhere, is caught."""
        raw = small.log.read_bytes()
        off = data.draw(st.integers(0, len(raw) - 1))
        value = data.draw(st.integers(0, 255).filter(lambda v: v != raw[off]))
        copy = small.copy_to(tmp_path / f"h{off}-{value}")
        copy.log.write_bytes(raw[:off] + bytes([value]) + raw[off + 1:])
        report = verify(copy.log)
        assert report.status in {"tampered", "truncated", "forked"}
        assert report.first_bad_seq is not None
        shutil.rmtree(copy.log.parent)


class TestTruncation:
    def test_every_cut_is_caught(self, small: LogFiles, tmp_path: Path) -> None:
        """Cutting the log at any offset short of its end is truncated, at the first missing seq."""
        data = small.log.read_bytes()
        kinds = line_kinds(small.lines())
        last_seq = max(s for k, s in kinds if k == "record")
        copy = small.copy_to(tmp_path / "copy")
        misses = []
        for cut in range(len(data)):
            prefix = data[:cut]
            complete = prefix.count(b"\n")
            records = sum(1 for k, _ in kinds[:complete] if k == "record")
            if not prefix.endswith(b"\n") and prefix:
                torn = prefix[prefix.rfind(b"\n") + 1:]
                # a torn head names the record before it; "{" or '{"' could be either: next record
                want = records - 1 if torn.startswith(b'{"h') else records
            else:
                want = records if records <= last_seq else last_seq
            copy.log.write_bytes(prefix)
            report = verify(copy.log)
            if ("truncated", want) != (report.status, report.first_bad_seq):
                misses.append((cut, want, report.status, report.first_bad_seq, report.message))
        assert [] == misses

    def test_cut_after_last_head_without_head_file_is_unanchored(self, small: LogFiles,
                                                                 tmp_path: Path) -> None:
        """Without audit.head a cut at a line boundary can't be proven; verify says so."""
        with small.writer(head_every_records=100, head_every_seconds=1e9, clock=FakeClock(2e9)) as w:
            for i in range(3):
                w.append_sync({"type": "intent", "n": i})
        lines = small.lines()
        copy = small.copy_to(tmp_path / "copy")
        copy.head.unlink()
        copy.write_lines(lines[:-2])  # drop the close head and the last record
        report = verify(copy.log)
        assert ("unanchored", 9, 7, 1) == (report.status, report.records, report.last_signed_seq,
                                           report.unanchored)
        assert "cannot be ruled out" in report.message

    def test_rollback_to_an_older_copy(self, tmp_path: Path) -> None:
        """An older, complete copy of the log put back in place is truncated (audit.head is newer)."""
        files = make_log(tmp_path / "a", 4)
        old = files.log.read_bytes()
        with files.writer(clock=FakeClock(2e9)) as w:
            w.append_sync({"type": "unlock", "by": "eve"})
        files.log.write_bytes(old)
        report = verify(files.log)
        assert ("truncated", 4) == (report.status, report.first_bad_seq)


class TestStructure:
    def test_deleted_record(self, small: LogFiles) -> None:
        """Removing record 4 is tampered at 4."""
        lines = small.lines()
        kinds = line_kinds(lines)
        small.write_lines([ln for ln, k in zip(lines, kinds) if k != ("record", 4)])
        assert ("tampered", 4) == (verify(small.log).status, verify(small.log).first_bad_seq)

    def test_deleted_first_record(self, small: LogFiles) -> None:
        """Removing record 0 is tampered at 0."""
        small.write_lines(small.lines()[1:])
        report = verify(small.log)
        assert ("tampered", 0) == (report.status, report.first_bad_seq)

    @pytest.mark.parametrize("a,b", [(1, 2), (4, 5), (1, 5)], ids=["adjacent", "across-head", "apart"])
    def test_reordered_records(self, small: LogFiles, a: int, b: int) -> None:
        """Swapping two records is tampered at the first of them."""
        lines = small.lines()
        kinds = line_kinds(lines)
        i, j = kinds.index(("record", a)), kinds.index(("record", b))
        lines[i], lines[j] = lines[j], lines[i]
        small.write_lines(lines)
        report = verify(small.log)
        assert ("tampered", a) == (report.status, report.first_bad_seq)

    def test_duplicated_record(self, small: LogFiles) -> None:
        """A record line repeated later is tampered where it was inserted, not a fork."""
        lines = small.lines()
        kinds = line_kinds(lines)
        at = kinds.index(("record", 5))
        small.write_lines(lines[:at] + [lines[kinds.index(("record", 2))]] + lines[at:])
        report = verify(small.log)
        assert ("tampered", 5) == (report.status, report.first_bad_seq)

    def test_fork(self, small: LogFiles, tmp_path: Path) -> None:
        """A second writer continuing from seq 4 on a copy, merged back, is forked at 5."""
        lines = small.lines()
        kinds = line_kinds(lines)
        branch = small.copy_to(tmp_path / "branch")
        branch.head.unlink()
        branch.write_lines(lines[: kinds.index(("record", 4)) + 1])
        with branch.writer(clock=FakeClock(1.9e9)) as w:  # seq 5: its log_recovered record
            assert 6 == w.append_sync({"type": "intent", "branch": "b"})
            w.append_sync({"type": "intent", "branch": "b"})
        extra = [ln for ln, k in zip(branch.lines(), line_kinds(branch.lines())) if k[1] >= 5]
        small.write_lines(lines + extra)
        report = verify(small.log)
        assert ("forked", 5) == (report.status, report.first_bad_seq)

    def test_interleaved_fork(self, small: LogFiles, tmp_path: Path) -> None:
        """Two writers interleaving the same seq (no lock, e.g. a copied home) is forked, not tampered."""
        lines = small.lines()
        kinds = line_kinds(lines)
        branch = small.copy_to(tmp_path / "branch")
        branch.head.unlink()
        branch.write_lines(lines[: kinds.index(("record", 2)) + 1])
        with branch.writer(clock=FakeClock(1.9e9)) as w:
            w.append_sync({"type": "intent", "branch": "b"})
        other3 = branch.lines()[len(lines[: kinds.index(("record", 2)) + 1])]
        at = kinds.index(("record", 3)) + 1
        small.write_lines(lines[:at] + [other3] + lines[at:])
        report = verify(small.log)
        assert ("forked", 3) == (report.status, report.first_bad_seq)

    def test_rewrite_with_recomputed_hashes_keeps_old_heads(self, small: LogFiles) -> None:
        """Altering record 4 and recomputing every hash after it: the next head no longer matches."""
        lines = small.lines()
        kinds = line_kinds(lines)
        at = kinds.index(("record", 4))
        lines[at] = corrupt_ct(lines[at])
        small.write_lines(rechain(lines))
        report = verify(small.log)
        assert ("tampered", 4) == (report.status, report.first_bad_seq)
        assert "does not match the chain" in report.message

    def test_rewrite_without_heads_against_head_file(self, small: LogFiles) -> None:
        """Recomputed hashes with the head lines stripped: audit.head no longer matches."""
        lines = small.lines()
        lines[0] = corrupt_ct(lines[0])
        small.write_lines([ln for ln in rechain(lines) if not ln.startswith(b'{"head"')])
        report = verify(small.log)
        assert ("tampered", 6) == (report.status, report.first_bad_seq)

    def test_rewrite_without_any_anchor_is_unverifiable(self, small: LogFiles) -> None:
        """Recomputed hashes, heads stripped and audit.head deleted: nothing vouches for it."""
        lines = small.lines()
        lines[0] = corrupt_ct(lines[0])
        small.write_lines([ln for ln in rechain(lines) if not ln.startswith(b'{"head"')])
        small.head.unlink()
        report = verify(small.log)
        assert ("unverifiable", None) == (report.status, report.first_bad_seq)

    def test_whole_log_resigned_with_another_key(self, small: LogFiles, tmp_path: Path) -> None:
        """A forger's log (own signing key) under the real audit.pub is tampered at 0."""
        forged = make_log(tmp_path / "forged", 7, head_every_records=3)
        shutil.copyfile(forged.log, small.log)
        shutil.copyfile(forged.head, small.head)
        report = verify(small.log)
        assert ("tampered", 0) == (report.status, report.first_bad_seq)
        assert "signature" in report.message

    def test_pinned_key_catches_a_replaced_public_key(self, small: LogFiles, tmp_path: Path) -> None:
        """Replacing log, head and .pub together fools the default; a pinned key does not."""
        pinned = tmp_path / "pinned.pub"
        shutil.copyfile(small.pub, pinned)
        forged = make_log(tmp_path / "forged", 7, head_every_records=3)
        for src, dst in ((forged.log, small.log), (forged.head, small.head), (forged.pub, small.pub)):
            shutil.copyfile(src, dst)
        assert "intact" == verify(small.log).status
        report = verify(small.log, pinned)
        assert ("tampered", 0) == (report.status, report.first_bad_seq)

    def test_missing_public_key_is_unverifiable(self, small: LogFiles) -> None:
        """Without audit.pub the chain is checked but the verdict is unverifiable."""
        small.pub.unlink()
        report = verify(small.log)
        assert ("unverifiable", 7) == (report.status, report.records)
        assert "no public key" in report.message

    def test_unknown_key_format_is_unverifiable(self, small: LogFiles) -> None:
        """A .pub that is not an Ed25519 key makes the log unverifiable."""
        small.pub.write_text("not a key\n")
        assert "unverifiable" == verify(small.log).status

    def test_missing_public_key_still_reports_tampering(self, small: LogFiles) -> None:
        """Structural damage is reported even when signatures can't be checked."""
        small.pub.unlink()
        small.write_lines(small.lines()[1:])
        assert "tampered" == verify(small.log).status

    def test_raw_base64_public_key_accepted(self, small: LogFiles, tmp_path: Path) -> None:
        """A pinned key may be given as base64 of the raw 32 bytes."""
        from cryptography.hazmat.primitives import serialization
        raw = small.signing_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                          serialization.PublicFormat.Raw)
        import base64
        pinned = tmp_path / "raw.pub"
        pinned.write_bytes(base64.b64encode(raw) + b"\n")
        assert "intact" == verify(small.log, pinned).status


class TestBadInput:
    def test_missing_file(self, tmp_path: Path) -> None:
        """A missing log is bad input, not a verdict."""
        with pytest.raises(BadInput, match="no audit log"):
            verify(tmp_path / "nope.log")

    def test_directory(self, tmp_path: Path) -> None:
        """A directory is bad input."""
        with pytest.raises(BadInput):
            verify(tmp_path)

    def test_not_a_log(self, tmp_path: Path) -> None:
        """A file with no record or head line is not an audit log."""
        p = tmp_path / "x.log"
        p.write_text("hello\nworld\n")
        with pytest.raises(BadInput, match="not a vaultsim audit log"):
            verify(p)

    def test_missing_pinned_key(self, small: LogFiles, tmp_path: Path) -> None:
        """A pinned key that does not exist is bad input."""
        with pytest.raises(BadInput, match="no public key"):
            verify(small.log, tmp_path / "missing.pub")


def test_public_pem_round_trip(tmp_path: Path) -> None:
    """The PEM the writer leaves beside the log is what verify reads."""
    key = Ed25519PrivateKey.generate()
    p = tmp_path / "k.pub"
    p.write_bytes(public_pem(key.public_key()))
    from vault.audit.keys import load_public_key
    assert public_pem(load_public_key(p)) == public_pem(key.public_key())
    assert os.path.getsize(p) > 0
