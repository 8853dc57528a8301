"""The process that reads the runner's fanotify events (vault.runner.opens).

Why a process of its own: the opener's ancestry must be read from /proc while
the opener still runs, and a shell agent's `cat` lives a millisecond. A thread
of the runner waits for the interpreter lock behind the runner's loop (5 ms
a switch): nearly every `cat` was gone. This process does nothing else.

    python -m vault.runner.opens_reader FD RUNNER_PID [DIR_FD]
    stdout: one JSON object a line per event
        {"dev", "ino", "pid", "chain", "comm", "host", "mask", ["pdev", "pino", "name", "fh"]}
                                                  an open or write (chain: vault.lineage, at the
                                                  event; host: the opener is in this process's PID
                                                  namespace, i.e. the runner's: in no jail); with
                                                  DIR_FD given (-1: no entry group, before Linux
                                                  5.9), a write's directory (device, inode) by the
                                                  name it was opened by, and a gone writer's
                                                  ancestry from its fork, and the file's handle
                                                  (vault.runner.neighbour_state: the older watch, and
                                                  a state file written through a link elsewhere)
        {"fid": 1, "dfid", "name", "pid", "chain", "comm", "mask", ["dfid2", "name2"]}
                                                  from DIR_FD, a group reporting directory entries
                                                  (FAN_REPORT_DFID_NAME): an entry `name` of the
                                                  directory whose file handle is `dfid` made,
                                                  removed, written, or renamed (to dfid2/name2);
                                                  the writer's ancestry as above, or when it was
                                                  gone, from the forks this process heard of
                                                  (vault.runner.forks; "forks": true)
                                                  (every one queued before an open is told
                                                  before it: a watch's fence comes after them)
        {"overflow": true}                        the kernel's queue overflowed: events lost
        {"ready": true}                           first: it reads from now on

It exits when its parent (the runner) is gone, or its stdout is.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import struct
import sys
import time
from typing import Any

from vault.lineage import Chain, lineage
from vault.runner.file_handle import handle
from vault.runner.forks import Forks

_META = struct.Struct("=IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid
FAN_Q_OVERFLOW = 0x4000
FAN_WRITES = 0x2 | 0x8  # FAN_MODIFY, FAN_CLOSE_WRITE
_INFO = struct.Struct("=BBHii")  # info_type, pad, len, fsid (two ints)
_HANDLE = struct.Struct("=Ii")  # handle_bytes, handle_type
DFID_NAME, OLD_DFID_NAME, NEW_DFID_NAME = 2, 10, 12
PARENT_CHECK_S = 1.0
FORKS_DRAIN_S = 0.25  # the fork reports read this often (8 MiB of them buffered: ~10,000)
FORKS_AT_ONCE = 32


def main(argv: list[str]) -> int:
    fd, runner = int(argv[0]), int(argv[1])
    dirs = int(argv[2]) if len(argv) > 2 else -1
    with contextlib.suppress(OSError, AttributeError):
        # woken first: the ancestry of a `cat` must be read within the millisecond it lives (root
        # may; it blocks on its fd between events, and the kernel caps a realtime task's share)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    os.set_blocking(fd, False)
    forks = None
    if dirs >= 0:
        os.set_blocking(dirs, False)
    where = len(argv) > 2  # a write's directory told (state directories, the audit log's: either group)
    if where:
        forks = Forks.listen()  # who forked whom, for a writer gone before its ancestry was read
    here = _pid_ns("self")
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")  # the runner starts no watch before this
    out.flush()
    fds = [fd] + ([dirs] if dirs >= 0 else [])
    drained, more = time.monotonic(), False
    while os.getppid() == runner:
        wait = 0.0 if more else FORKS_DRAIN_S if forks is not None else PARENT_CHECK_S
        ready, _, _ = select.select(fds, [], [], wait)
        # the opens first: a `cat`'s ancestry must be read within the millisecond it lives
        lines = _opens(fd, runner, here, forks, where) if fd in ready else []
        # then every entry event queued before them, told before them: a watch's fence (an open)
        # must come after every change made before it (vault.runner.neighbour_state)
        if dirs >= 0 and (fd in ready or dirs in ready) and not _entries(dirs, runner, forks, out):
            return 0
        if not _tell(lines, out):
            return 0
        if forks is not None and (more or time.monotonic() - drained >= FORKS_DRAIN_S):
            # read in turns, not at each fork (a host's every fork would wake this realtime task),
            # and a few at a time, the opens looked at between them
            more = forks.drain(FORKS_AT_ONCE)
            drained = time.monotonic()
    return 0


def _opens(fd: int, runner: int, here: str | None, forks: Forks | None = None,
           where: bool = False) -> list[dict[str, Any]]:
    """The opens group's events, as lines to tell; `where`: a write's directory told too (it
    watches directories' writes), and a gone writer's ancestry from `forks` where there are."""
    try:
        data = os.read(fd, 1 << 16)
    except (BlockingIOError, InterruptedError):
        return []
    lines: list[dict[str, Any]] = []
    i = 0
    while i + _META.size <= len(data):
        length, _, _, _, mask, efd, pid = _META.unpack_from(data, i)
        i += max(length, _META.size)
        if mask & FAN_Q_OVERFLOW:
            lines.append({"overflow": True})
        if efd < 0:
            continue
        try:
            # the opener's ancestry first: it may end any moment
            names: list[str] = []
            chain = lineage(pid, names) if pid != runner else []
            # read while the chain was there to read (a gone opener's pid is told nothing)
            host = bool(chain) and here is not None and _pid_ns(str(pid)) == here
            comm = names[0][:40] if names else ""
            st = os.fstat(efd)
            line = {"dev": st.st_dev, "ino": st.st_ino, "pid": pid, "chain": chain, "comm": comm,
                    "host": host, "mask": mask}
            if (where or forks is not None) and mask & FAN_WRITES:  # only writes: the opens' path stays short
                line.update(_where(efd))
                told = handle(efd)  # the written file's own (a state file's mark: neighbour_state)
                if told is not None:
                    line["fh"] = told
                if forks is not None and pid and pid != runner:
                    line["chain"] = writer_chain(pid, chain, forks)
            lines.append(line)
        except OSError:
            pass
        finally:
            os.close(efd)
    return lines


def writer_chain(pid: int, chain: Chain, forks: Forks) -> Chain:
    """A writer's ancestry: `chain` as /proc gave it at the event, mended from the forks heard
    where it was cut short or its process adopted (vault.runner.forks.Forks.mend); a gone
    writer's, from them alone."""
    forks.drain()  # every fork before this event is queued already
    return forks.mend(chain) if chain else forks.chain(pid)


def _entries(fd: int, runner: int, forks: Forks | None, out: Any) -> bool:
    """The directory group's events, every one queued now, told as lines; False when stdout is gone."""
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return True
        if not _tell(_parse(data, runner, forks), out):
            return False


def _tell(lines: list[dict[str, Any]], out: Any) -> bool:
    try:
        if lines:
            out.write("".join(json.dumps(line) + "\n" for line in lines))
            out.flush()
    except (BrokenPipeError, OSError):
        return False
    return True


def _parse(data: bytes, runner: int, forks: Forks | None) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    i = 0
    while i + _META.size <= len(data):
        length, _, _, meta_len, mask, _, pid = _META.unpack_from(data, i)
        end = i + max(length, _META.size)
        if mask & FAN_Q_OVERFLOW:
            lines.append({"overflow": True, "fid": 1})
            i = end
            continue
        names: list[str] = []
        chain = lineage(pid, names) if pid != runner else []  # first: it may end any moment
        line: dict[str, Any] = {"fid": 1, "pid": pid, "mask": mask, "comm": names[0][:40] if names else ""}
        j = i + meta_len
        while j + _INFO.size <= end:
            kind, _, info_len, _, _ = _INFO.unpack_from(data, j)
            if info_len <= 0:
                break
            if kind in (DFID_NAME, OLD_DFID_NAME, NEW_DFID_NAME):
                size, htype = _HANDLE.unpack_from(data, j + _INFO.size)
                at = j + _INFO.size + _HANDLE.size
                handle = f"{htype}:{data[at:at + size].hex()}"
                name = data[at + size:j + info_len].split(b"\0", 1)[0].decode(errors="replace")[:255]
                suffix = "2" if kind == NEW_DFID_NAME else ""
                line["dfid" + suffix], line["name" + suffix] = handle, name
            j += info_len
        i = end
        if forks is not None and pid and pid != runner:
            gone = not chain
            chain = writer_chain(pid, chain, forks)
            if gone:
                line["forks"] = bool(chain)
        line["chain"] = chain
        if "dfid" in line:
            lines.append(line)
    return lines


def _where(fd: int) -> dict[str, Any]:
    """The directory the written file is in (device, inode) and its name there; {} if gone."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
        parent = os.stat(os.path.dirname(path))
    except OSError:
        return {}
    return {"pdev": parent.st_dev, "pino": parent.st_ino, "name": os.path.basename(path)[:255]}


def _pid_ns(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
