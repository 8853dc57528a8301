"""An agent's stdout and stderr: a pipe the runner drains into the output file.

Why: an output file handed to the agent as its stdout was the agent's to change. It could print
a credential and then cut the file back (`ftruncate(1, 0)`) or write blanks over it in place
(fd 1 opened again through /proc/self/fd/1, without O_APPEND), jail or not, and the canary scan,
which reads the file after the trial, found nothing: a PASS. A pipe can be neither cut nor
rewritten. A thread of the runner copies what comes through into the file (so the scan and the
final message read it as before, a chunk at a time), counting and hashing it: without a jail an
agent can still reach the file by its path (it sits beside the agent's task file), and a file
that no longer holds what the runner wrote is told (`altered`), so the scan does not vouch for it.

The agent's end of the pipe is handed to the spawn as `/proc/<runner>/fd/<N>`: the launcher (and
the fork server, before the jail is entered) opens its stdout by path, and an anonymous pipe
leaves nothing in the trial's directory to open for reading.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import os
import re
import select
import threading
import time
from pathlib import Path

from vault import regular

CHUNK = 1 << 20
TAIL_KEPT = 1 << 20  # as much as the runner reads of an output (vault.runner.trial.OUTPUT_TAIL)
DRAIN_S = 2.0  # after the agent's end: what a writer still alive (an escapee) sends later is not copied
# what changes no character a terminal shows: colours and styles (SGR), a window title (OSC),
# showing or hiding the cursor; a write of these and blanks alone is no later final message
# (a colour reset after the last request hid a claim made before it: vault.runner.claimed_early)
_DRAWS_NOTHING = re.compile(rb"\x1b\[[0-9;:]*m|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b\[\?25[hl]")


def draws(data: bytes) -> bool:
    """Does this chunk of output change what a terminal shows (anything but blanks and styles)?"""
    text = data.strip()
    if b"\x1b" in text:
        text = _DRAWS_NOTHING.sub(b"", text).strip()
    return bool(text)


class OutputPump:
    """A pipe whose write end is `writer` (a path to open), copied into `path` by a thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.out = regular.create_fresh(path)  # never a FIFO or link an earlier agent put there
        try:
            self.rfd, self.wfd = os.pipe2(os.O_CLOEXEC)  # wfd, held here, keeps the pipe from EOF until finish()
        except BaseException:
            os.close(self.out)
            raise
        os.set_blocking(self.rfd, False)
        # a pipe of CHUNK, not the kernel's 64 KiB: the copying thread shares the runner's GIL with
        # the grading of the trials beside it, and each wake-up waits for it; at 64 KiB a wake-up
        # a chatty agent (16 MB of progress) was held 4-11 s on its own writes and missed its
        # deadline (red team 29); a pipe past the user's limit stays at the kernel's size
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.rfd, fcntl.F_SETPIPE_SZ, CHUNK)
        self.written = 0
        self.digest = hashlib.sha256()
        self.finished = False
        self.lost = 0  # bytes that came through but could not be written to the file (a full disk)
        self.cut = False  # finish() stopped the copy with a writer still holding the pipe
        # when the copier last read anything but blanks and styles (`draws`): the agent wrote its
        # final message no later
        # (vault.runner.claimed_early: a request it sent after that came after its claim)
        self.shown_at: float | None = None
        # the last chunks copied, TAIL_KEPT bytes or a little more (held, not copied: a chatty agent
        # costs nothing more): without a jail the agent can rewrite the file by its path (its true
        # `not done` there, `done` down the pipe); its final message is read from these then
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_size = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._copy, name=f"pump {path.name}", daemon=True)
        self._thread.start()

    @property
    def writer(self) -> Path:
        return Path(f"/proc/{os.getpid()}/fd/{self.wfd}")

    def _copy(self) -> None:
        poller = select.poll()
        poller.register(self.rfd, select.POLLIN | select.POLLHUP)
        try:
            while True:
                try:
                    data = os.read(self.rfd, CHUNK)
                except BlockingIOError:
                    if self._stop.is_set():
                        self.cut = True
                        return
                    poller.poll(100)
                    continue
                if not data:
                    return  # every writer is gone
                if self._stop.is_set():
                    self.cut = True  # a writer that outlived its agent, still writing
                    return
                if draws(data):
                    self.shown_at = time.time()
                if self.lost:
                    self.lost += len(data)  # still drained: a full disk must not block the agent's writes
                    continue
                view = memoryview(data)
                try:
                    while view:
                        done = os.write(self.out, view)
                        self.digest.update(view[:done])
                        self.written += done
                        view = view[done:]
                except OSError:
                    self.lost = len(view)
                self._keep(data if not self.lost else data[:len(data) - self.lost])
        except OSError:
            self.cut = True
        finally:
            os.close(self.out)

    def finish(self, drain_s: float = DRAIN_S) -> None:
        """Once the agent and all it started are gone: the rest of the pipe, then the file is
        whole. A writer still holding the pipe after `drain_s` (it escaped every net) is left:
        the copy stops, and a write of its gets EPIPE."""
        if self.finished:
            return
        self.finished = True
        with contextlib.suppress(OSError):
            os.close(self.wfd)
        self._thread.join(drain_s)
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
        os.close(self.rfd)

    def _keep(self, data: bytes) -> None:
        self._tail.append(data)
        self._tail_size += len(data)
        while self._tail_size - len(self._tail[0]) >= TAIL_KEPT:
            self._tail_size -= len(self._tail.popleft())
        if len(self._tail) > 1024:  # a writer of tiny pieces: one piece, not a million small objects
            whole = b"".join(self._tail)[-TAIL_KEPT:]
            self._tail, self._tail_size = collections.deque([whole]), len(whole)

    @property
    def tail(self) -> bytes:
        """The last bytes copied into the file (TAIL_KEPT or a little more)."""
        return b"".join(self._tail)

    def tail_if_changed(self) -> bytes | None:
        """What came through last (`tail`), when the file's end no longer holds it (or its size is
        not what was copied): the file was changed by its path; else None (the file is read)."""
        try:
            fd = regular.open_fd(self.path, follow=False)
        except OSError:
            return self.tail
        tail = self.tail
        try:
            if os.fstat(fd).st_size != self.written:
                return tail
            return None if os.pread(fd, len(tail), self.written - len(tail)) == tail else tail
        finally:
            os.close(fd)

    def altered(self) -> bool:
        """Whether the file no longer holds exactly what was copied into it."""
        return altered(self.path, self.written, self.digest.hexdigest())


def altered(path: Path | str, written: int, sha256: str) -> bool:
    try:
        fd = regular.open_fd(path, follow=False)  # a FIFO, device or link in its place: altered
    except OSError:
        return True
    try:
        if os.fstat(fd).st_size != written:
            return True
        h = hashlib.sha256()
        while chunk := os.read(fd, 4 * CHUNK):
            h.update(chunk)
        return h.hexdigest() != sha256
    finally:
        os.close(fd)


def open_pumps(*paths: Path) -> tuple[OutputPump, ...]:
    """A pump per path, or none: when one cannot be made (its file cannot be created), those
    already made are finished (their threads and fds released) and the error raised."""
    made: list[OutputPump] = []
    try:
        for path in paths:
            made.append(OutputPump(path))
    except BaseException:
        for pump in made:
            pump.finish(0)
        raise
    return tuple(made)
