"""Rotation and retention: segments chained by signed heads, verified as a set or one by one,
recovered after a crash in the middle of a rotation, with memory that does not grow."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit_fixtures import FakeClock, FlakyIO, LogFiles
from vault.audit import decrypt_events, verify
from vault.audit import files as F
from vault.audit import records as R
from vault.errors import BadInput

SEGMENT = 4096  # the smallest segment size: a rotation every dozen records or so


def write_set(tmp_path: Path, n: int, **options) -> LogFiles:
    """`n` events through a writer rotating at 4 KiB (syncs skipped: only the format matters)."""
    files = LogFiles(tmp_path / "audit.log", os.urandom(32), Ed25519PrivateKey.generate())
    options.setdefault("segment_bytes", SEGMENT)
    with files.writer(io=FlakyIO(sync=False), clock=FakeClock(), head_every_records=50, **options) as w:
        for i in range(n):
            w.append_sync({"type": "intent", "n": i, "pad": "x" * 100})
    return files


def segment_files(files: LogFiles) -> list[Path]:
    return [p for _, p in F.rotated(files.log)]


class TestRotation:
    def test_segments_are_named_by_first_seq_and_start_with_the_previous_head(self, tmp_path: Path) -> None:
        """Each rotated segment is NAME.<first seq>.log; every segment after the first begins
        with the signed head that ended the one before, then a segment_started record."""
        files = write_set(tmp_path, 200)
        rotated = F.rotated(files.log)
        assert len(rotated) >= 5
        assert rotated[0][0] == 0
        previous_last = None
        for first, path in rotated + [(None, files.log)]:
            lines = path.read_bytes().split(b"\n")[:-1]
            if first == 0:
                assert R.parse_record(lines[0]).seq == 0
            else:
                head, rec = R.parse_head(lines[0]), R.parse_record(lines[1])
                assert (head.seq, head.hash) == previous_last
                assert (rec.seq, rec.prev) == (head.seq + 1, head.hash)
                assert first in (None, rec.seq)
            if path != files.log:  # a rotated segment ends with the head of its last record
                last_rec = [R.parse_record(x) for x in lines if x.startswith(R.RECORD_START)][-1]
                end = R.parse_head(lines[-1])
                assert (end.seq, end.hash) == (last_rec.seq, last_rec.hash)
                previous_last = (end.seq, end.hash)
        assert all(p.stat().st_size < SEGMENT + 2048 for p in segment_files(files))

    def test_the_set_verifies_intact_and_reads_back_in_order(self, tmp_path: Path) -> None:
        """verify(audit.log) checks every segment; decrypt_events returns every event in seq order."""
        files = write_set(tmp_path, 200)
        report = verify(files.log)
        n_segments = len(segment_files(files)) + 1
        events = decrypt_events(files.log, files.key)
        assert ("intact", n_segments, 0) == (report.status, report.segments, report.first_seq)
        assert report.records == len(events) == 200 + n_segments - 1  # one segment_started each
        assert [ev["seq"] for ev in events] == list(range(len(events)))
        assert [ev["n"] for ev in events if ev["type"] == "intent"] == list(range(200))
        assert f"{n_segments} segments" in report.message

    def test_the_command_checks_the_set_or_one_segment(self, tmp_path: Path, capsys) -> None:
        """`audit verify LOG --json` reports the set; with --segment, the active segment alone."""
        from vault.cli.main import main
        files = write_set(tmp_path, 120)
        assert 0 == main(["audit", "verify", str(files.log), "--json"])
        whole = json.loads(capsys.readouterr().out)
        assert 0 == main(["audit", "verify", str(files.log), "--segment", "--json"])
        one = json.loads(capsys.readouterr().out)
        assert (whole["segments"], one["segments"]) == (len(segment_files(files)) + 1, 1)
        assert one["records"] < whole["records"] and one["first_seq"] > 0

    def test_each_segment_verifies_on_its_own(self, tmp_path: Path) -> None:
        """A rotated segment's path checks that segment alone, anchored by the head it starts with."""
        files = write_set(tmp_path, 120)
        for first, path in F.rotated(files.log):
            report = verify(path)
            assert ("intact", 1, first) == (report.status, report.segments, report.first_seq), report
        active = verify(files.log, segment_only=True)
        assert ("intact", 1) == (active.status, active.segments)
        assert active.first_seq == len(decrypt_events(files.log, files.key)) - active.records

    def test_retention_keeps_the_newest_segments_and_what_remains_verifies(self, tmp_path: Path) -> None:
        """keep_segments=2: two rotated segments and the active one remain; verify says intact,
        anchored by the first kept segment's head, and names the seqs no longer there."""
        files = write_set(tmp_path, 300, keep_segments=2)
        kept = F.rotated(files.log)
        assert len(kept) == 2
        report = verify(files.log)
        assert ("intact", 3) == (report.status, report.segments)
        assert report.first_seq == kept[0][0] > 0
        assert f"records 0-{kept[0][0] - 1} are not here" in report.message
        events = decrypt_events(files.log, files.key)
        assert events[0]["seq"] == kept[0][0] and events[-1]["seq"] == report.first_seq + report.records - 1

    def test_a_missing_middle_segment_is_truncated(self, tmp_path: Path) -> None:
        """Removing a segment between two others: truncated at its first seq."""
        files = write_set(tmp_path, 200)
        rotated = F.rotated(files.log)
        first, gone = rotated[2]
        gone.unlink()
        report = verify(files.log)
        assert ("truncated", first) == (report.status, report.first_bad_seq)
        assert "missing" in report.message

    def test_a_renamed_segment_is_tampered(self, tmp_path: Path) -> None:
        """A segment whose name does not match its first seq was moved: tampered."""
        files = write_set(tmp_path, 200)
        first, path = F.rotated(files.log)[2]
        path.rename(F.segment_path(files.log, first + 1))
        assert "tampered" == verify(files.log).status

    def test_a_log_starting_mid_chain_without_rotated_segments_is_tampered(self, tmp_path: Path) -> None:
        """The active segment alone, starting with a carried head: records from 0 are missing."""
        files = write_set(tmp_path, 100)
        for path in segment_files(files):
            path.unlink()
        report = verify(files.log)
        assert ("tampered", 0) == (report.status, report.first_bad_seq)

    def test_a_damaged_record_in_an_old_segment_is_found(self, tmp_path: Path) -> None:
        """A flipped byte inside a rotated segment is tampered at that record's seq."""
        files = write_set(tmp_path, 200)
        first, path = F.rotated(files.log)[1]
        lines = path.read_bytes().split(b"\n")
        victim = next(i for i, line in enumerate(lines) if line.startswith(R.RECORD_START) and i > 2)
        seq = R.parse_record(lines[victim]).seq
        lines[victim] = lines[victim].replace(b'"ct":"', b'"ct":"A', 1)
        path.write_bytes(b"\n".join(lines))
        assert ("tampered", seq) == (verify(files.log).status, verify(files.log).first_bad_seq)

    def test_reopening_continues_the_set(self, tmp_path: Path) -> None:
        """A writer reopened on a rotated set continues the chain and keeps rotating."""
        files = write_set(tmp_path, 100)
        before = len(segment_files(files))
        with files.writer(io=FlakyIO(sync=False), clock=FakeClock(2e9), segment_bytes=SEGMENT) as w:
            for i in range(100):
                w.append_sync({"type": "intent", "n": 100 + i, "pad": "y" * 100})
        assert len(segment_files(files)) > before
        report = verify(files.log)
        assert report.intact, report
        assert [ev["n"] for ev in decrypt_events(files.log, files.key) if ev["type"] == "intent"] == list(range(200))


def damage(files: LogFiles, how: str) -> None:
    """Damage a rotated set in one of the ways the parallel walk must report as the serial one does."""
    rotated = F.rotated(files.log)
    if how == "flip":  # a byte inside a record of a middle segment
        path = rotated[2][1]
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 1
        path.write_bytes(bytes(data))
    elif how == "missing":
        rotated[3][1].unlink()
    elif how == "renamed":
        first, path = rotated[1]
        path.rename(F.segment_path(files.log, first + 1))
    elif how == "torn":  # a middle segment cut short
        path = rotated[2][1]
        path.write_bytes(path.read_bytes()[:-40])
    elif how == "resigned":  # a middle segment whose first head was signed by another key
        path = rotated[2][1]
        lines = path.read_bytes().split(b"\n")
        head = R.parse_head(lines[0])
        other = Ed25519PrivateKey.generate()
        lines[0] = R.head_line(head.message, other.sign(head.message))[:-1]
        path.write_bytes(b"\n".join(lines))
    elif how == "head-file-behind":  # the head file lagging (a writer killed before replacing it)
        path = rotated[1][1]
        files.head.write_bytes(path.read_bytes().split(b"\n")[-2] + b"\n")


class TestParallel:
    @pytest.mark.parametrize("how", ["none", "flip", "missing", "renamed", "torn", "resigned", "head-file-behind"])
    def test_workers_report_exactly_what_one_process_does(self, tmp_path: Path, how: str) -> None:
        """Rotated segments walked in worker processes: the same report, field for field (a head
        file naming a head inside an old segment is a lagging one, not damage)."""
        files = write_set(tmp_path, 300)
        damage(files, how)
        serial = verify(files.log, jobs=1)
        parallel = verify(files.log, jobs=2)
        assert serial == parallel
        assert (serial.status == "intact") == (how in ("none", "head-file-behind")), serial


class TestCrashMidRotation:
    def test_an_unfinished_next_segment_is_removed_at_open(self, tmp_path: Path) -> None:
        """A crash before the renames leaves .audit.log.next: it was never the log; removed."""
        files = write_set(tmp_path, 60)
        leftover = F.next_path(files.log)
        leftover.write_bytes(b"half a segment")
        with files.writer(clock=FakeClock(2e9)) as w:
            w.append_sync({"type": "after"})
        assert not leftover.exists()
        assert verify(files.log).intact

    def test_a_missing_active_segment_is_started_again(self, tmp_path: Path) -> None:
        """A crash between the two renames: the active segment is gone, the rotated one is
        complete. The writer starts the next segment from its signed head; the set is intact."""
        files = write_set(tmp_path, 60)
        events_before = decrypt_events(files.log, files.key)
        # the active segment (closed: it ends with its last record's head) renamed away, as the
        # first rename of a rotation does, and its successor never put in place
        start = R.parse_head(files.log.read_bytes().split(b"\n", 1)[0]).seq + 1
        files.log.rename(F.segment_path(files.log, start))
        with files.writer(clock=FakeClock(2e9), segment_bytes=SEGMENT) as w:
            w.append_sync({"type": "after"})
        report = verify(files.log)
        assert report.intact, report
        events = decrypt_events(files.log, files.key)
        assert events[: len(events_before)] == events_before
        assert [ev["type"] for ev in events[len(events_before):]] == ["segment_started", "after"]


class TestFlat:
    def test_verify_memory_does_not_grow_with_the_log(self, tmp_path: Path, monkeypatch) -> None:
        """Peak memory of verify over 3x the records stays within 1.5x (lines are streamed, no
        per-record state is kept). Read 256 KiB at a time here, so both logs span many reads."""
        from vault.audit.verify import LineReader
        monkeypatch.setattr(LineReader, "CHUNK", 256 << 10)
        def peak(n: int, where: Path) -> int:
            where.mkdir()
            files = LogFiles(where / "audit.log", os.urandom(32), Ed25519PrivateKey.generate())
            with files.writer(io=FlakyIO(sync=False), segment_bytes=None) as w:
                for i in range(n):
                    w.append_sync({"type": "intent", "n": i})
            tracemalloc.start()
            try:
                assert verify(files.log).intact
                return tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()

        small, big = peak(10_000, tmp_path / "a"), peak(30_000, tmp_path / "b")
        assert big < small * 1.5, (small, big)


class TestNotARegularFile:
    def test_verify_refuses_a_fifo_instead_of_waiting(self, tmp_path: Path) -> None:
        """A FIFO named as the log is bad input at once (nothing writes to it: a read would hang)."""
        fifo = tmp_path / "audit.log"
        os.mkfifo(fifo)
        with pytest.raises(BadInput, match="not a regular file"):
            verify(fifo)
        with pytest.raises(BadInput, match="not a regular file"):
            decrypt_events(fifo, os.urandom(32))

    def test_the_command_exits_2_on_a_fifo(self, tmp_path: Path, capsys) -> None:
        """`vaultsim audit verify FIFO` is bad input (exit 2) with a clear message, not a hang."""
        from vault.cli.main import main
        fifo = tmp_path / "audit.log"
        os.mkfifo(fifo)
        assert 2 == main(["audit", "verify", str(fifo)])
        assert "not a regular file" in capsys.readouterr().err

    def test_verify_refuses_a_device(self, tmp_path: Path) -> None:
        """/dev/null as the log (a symlink to it) is bad input, not an empty intact log."""
        log = tmp_path / "audit.log"
        log.symlink_to("/dev/null")
        with pytest.raises(BadInput, match="not a regular file"):
            verify(log)

    def test_a_fifo_head_file_is_refused(self, tmp_path: Path) -> None:
        """The head file beside the log is read the same way, never waited on: a FIFO there is a
        set that does not verify (tampered, exit 1; the LOG named was fine: not bad input)."""
        files = write_set(tmp_path, 5)
        files.head.unlink()
        os.mkfifo(files.head)
        report = verify(files.log)
        assert report.status == "tampered" and "not a regular file" in report.message
