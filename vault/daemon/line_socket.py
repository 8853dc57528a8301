"""One connected Unix stream socket, driven by the event loop: lines in, bytes out.

asyncio's streams read with recv(), which loses who wrote the bytes; this
reads with recvmsg() and SCM_CREDENTIALS, so every line comes with the pid of
the process that wrote it (Linux never merges the writes of two processes in
one recvmsg). A line whose bytes came from two processes is reported as
MIXED, so a child that inherited its parent's connection can neither act as
the parent nor finish the parent's half-written line.

Nothing here waits on the client:

* Writes never block. What the kernel does not take at once waits in this
  connection's buffer; past MAX_OUTBOUND_BYTES the connection is closed (a
  client that stopped reading is dropped, not waited for), and past
  OUTBOUND_PAUSE_BYTES it is not read, so a client that does not read its
  answers is not served more of them.
* Bytes of an unfinished line are charged to a budget (per process and in
  all, see vault.daemon.limits) before they are kept; a line the budget refuses
  closes the connection with an error line instead of growing the daemon.

End of input is not the end of the connection. A client that half-closes
(shutdown SHUT_WR: `socat`, a script that says "no more requests") still
reads: its last line is handled even without a newline, and the connection
closes once the owner says its requests are answered (`close_when_drained`)
and their answers are sent. A client that closed both ways (POLLHUP) can read
nothing: it is closed at once, its unfinished line dropped; one that hangs up
while its answers are still being worked on is noticed within a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
import time
from typing import Callable, Protocol

from vault.jsonrpc import MAX_FRAME
from vault.daemon.limits import MAX_OUTBOUND_BYTES, OUTBOUND_PAUSE_BYTES
from vault.daemon.peer import CREDS_SPACE, sender

log = logging.getLogger("vaultsim.rpc")

READ_CHUNK = 64 * 1024
HANGUP_POLL_S = 1.0  # a half-closed connection waiting for its answers: is its client still there?

# the writer of a line, when it is not one process of ours
UNKNOWN = 0  # the kernel named no process (not visible from the daemon's pid namespace)
FOREIGN = -1  # a process of another user
MIXED = -2  # bytes from more than one process


class Budget(Protocol):
    def charge(self, n: int) -> str | None: ...  # None if granted, else why not
    def refund(self, n: int) -> None: ...


class LineSocket:
    def __init__(self, sock: socket.socket, uid: int, budget: Budget,
                 on_line: Callable[[bytes, int], None], on_close: Callable[[str], None],
                 on_refused: Callable[[str], bytes], on_eof: Callable[[], None] | None = None) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.uid = uid
        self.budget = budget
        self.on_line = on_line
        self.on_close = on_close
        self.on_refused = on_refused  # why -> the error line to send before closing
        self.on_eof = on_eof  # the client sent its last byte (it may still read)
        self.eof = False
        self._drain_reason: str | None = None  # close once the output is sent
        self._hangup_check: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self.close_reason = ""
        self._partial = bytearray()
        self._partial_writers: set[int] = set()
        self._out = bytearray()
        self._writing = False
        self._reading = False
        self._last_progress = time.monotonic()

    # ---- reading --------------------------------------------------------------------

    def start(self) -> None:
        self._resume_reading()

    def _resume_reading(self) -> None:
        if not self._reading and not self.closed:
            self.loop.add_reader(self.fd, self._readable)
            self._reading = True

    def _pause_reading(self) -> None:
        if self._reading:
            self.loop.remove_reader(self.fd)
            self._reading = False

    def _readable(self) -> None:
        try:
            data, anc, _flags, _addr = self.sock.recvmsg(READ_CHUNK, CREDS_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close("read failed")
            return
        if not data:
            self._end_of_input()
            return
        who = sender(anc)
        if who is None:
            writer = UNKNOWN
        else:
            writer = who[0] if who[1] == self.uid else FOREIGN
        start = 0
        while not self.closed:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            if self._partial:
                if len(self._partial) + nl + 1 - start > MAX_FRAME + 1:
                    self._refuse("frame larger than 1 MiB")
                    return
                self._partial += data[start:nl + 1]
                line = bytes(self._partial)
                writers = self._partial_writers | {writer}
                self.budget.refund(len(self._partial) - (nl + 1 - start))
                self._partial.clear()
                self._partial_writers = set()
                line_writer = writer if len(writers) == 1 else MIXED
            else:
                if nl + 1 - start > MAX_FRAME + 1:
                    self._refuse("frame larger than 1 MiB")
                    return
                line = data[start:nl + 1]
                line_writer = writer
            start = nl + 1
            try:
                self.on_line(line, line_writer)
            except Exception as exc:  # a bug in handling one line must not wedge the connection
                log.error("handling a line failed: %s", type(exc).__name__)
        if self.closed or start >= len(data):
            return
        rest = len(data) - start
        if len(self._partial) + rest > MAX_FRAME + 1:
            self._refuse("frame larger than 1 MiB")
            return
        why = self.budget.charge(rest)
        if why is not None:
            self._refuse(why)
            return
        self._partial += data[start:] if start else data
        self._partial_writers.add(writer)

    def _end_of_input(self) -> None:
        self.eof = True
        self._pause_reading()
        if self._hung_up():
            self.close("the client closed the connection")
            return
        if len(self._partial) > MAX_FRAME:
            # the unfinished line may hold MAX_FRAME + 1 bytes (room for its newline); without
            # one, that last byte is past the bound a newline-ended line is held to
            self._refuse("frame larger than 1 MiB")
            return
        if self._partial:  # the last line, without its newline
            line, writers = bytes(self._partial), self._partial_writers
            self.budget.refund(len(self._partial))
            self._partial, self._partial_writers = bytearray(), set()
            try:
                self.on_line(line, writers.pop() if len(writers) == 1 else MIXED)
            except Exception as exc:
                log.error("handling a line failed: %s", type(exc).__name__)
        if self.on_eof is None:
            self.close_when_drained("the client closed the connection")
        else:
            self.on_eof()
        if not self.closed:
            self._hangup_check = self.loop.call_later(HANGUP_POLL_S, self._check_hangup)

    def _hung_up(self) -> bool:
        """Did the client close both ways (it can read no answer)?"""
        try:
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            return any(ev & (select.POLLHUP | select.POLLERR) for _, ev in poller.poll(0))
        except (OSError, ValueError):
            return True

    def _check_hangup(self) -> None:
        self._hangup_check = None
        if self.closed:
            return
        if self._hung_up():
            self.close("the client closed the connection")
        else:
            self._hangup_check = self.loop.call_later(HANGUP_POLL_S, self._check_hangup)

    def close_when_drained(self, reason: str) -> None:
        """Close once every queued byte is sent (now, if none is)."""
        if not self._out:
            self.close(reason)
        else:
            self._drain_reason = reason

    def _refuse(self, why: str) -> None:
        """A line that cannot be kept: say why, then close (the stream cannot be resynchronised)."""
        frame = self.on_refused(why)
        if not self._out:
            with contextlib.suppress(OSError):
                self.sock.send(frame)
        self.close(why)

    # ---- writing --------------------------------------------------------------------

    def write(self, frame: bytes) -> bool:
        """Send or queue `frame` without waiting; False if the connection is (now) closed."""
        if self.closed:
            return False
        if self._out:
            if len(self._out) + len(frame) > MAX_OUTBOUND_BYTES:
                self.close(f"it stopped reading ({len(self._out)} bytes unsent)")
                return False
            self._out += frame
        else:
            try:
                sent = self.sock.send(frame)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.close("write failed")
                return False
            if sent == len(frame):
                return True
            self._out += memoryview(frame)[sent:]
            self._last_progress = time.monotonic()
            self.loop.add_writer(self.fd, self._writable)
            self._writing = True
        if len(self._out) > OUTBOUND_PAUSE_BYTES:
            self._pause_reading()
        return True

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close("write failed")
            return
        if sent:
            del self._out[:sent]
            self._last_progress = time.monotonic()
        if not self._out:
            self.loop.remove_writer(self.fd)
            self._writing = False
            if self._drain_reason is not None:
                self.close(self._drain_reason)
                return
        if len(self._out) <= OUTBOUND_PAUSE_BYTES // 2 and not self.eof:
            self._resume_reading()

    def backlog(self) -> int:
        """Bytes written but not yet taken by the kernel."""
        return len(self._out)

    def stalled_for(self) -> float:
        """Seconds the backlog has waited without the client taking a byte (0 if none waits)."""
        return time.monotonic() - self._last_progress if self._out else 0.0

    # ---- closing --------------------------------------------------------------------

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        self._pause_reading()
        if self._hangup_check is not None:
            self._hangup_check.cancel()
            self._hangup_check = None
        if self._writing:
            self.loop.remove_writer(self.fd)
            self._writing = False
        if self._partial:
            self.budget.refund(len(self._partial))
            self._partial = bytearray()
        self._out = bytearray()
        with contextlib.suppress(OSError):
            self.sock.close()
        self.on_close(reason)
