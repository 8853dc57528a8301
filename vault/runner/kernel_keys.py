"""Without a jail, what an agent left in the kernel's key retention service (add_key(2), `keyctl`).

Why: an unjailed agent handed a credential added a key holding it (type `user`) to the user's
keyring (`keyctl add user name VALUE @u`), or one named by it, and exited: the key outlives every
process of the user (the user keyring lives as long as the user does), any process of the user
reads it back (`keyctl print`), and the scan read files, processes and IPC only. In a jail the
agent has a user namespace of its own, and its user keyring goes with it.

Every key this process may view (/proc/keys) is read: its description, and its payload where it
may be read (KEYCTL_READ; a `logon` key's never can be, nor a key whose permissions keep this
user out: those are passed over). Key serials are random and carry no time, so every key is
looked at, not only those made during the trial: only this trial's credentials are looked for,
so another process's keys cannot fail it. A finding names a key by its serial, never its
description.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

PROC_KEYS = "/proc/keys"
KEYS_MOST = 1_000
KEY_BYTES = 1 << 20  # a user key's payload is at most 32 KiB, a big_key's 1 MiB
BYTES_MOST = 64 << 20
KEYCTL_READ = 11
# the keyctl system call's number, per architecture (glibc has no wrapper; libkeyutils may be absent)
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 271, "s390x": 280}


def _rows() -> list[tuple[int, str, str]]:
    """(serial, type, description) of each key listed."""
    out = []
    try:
        with open(PROC_KEYS, "rb") as f:
            for line in f:
                cells = line.decode("utf-8", "replace").rstrip("\n").split(None, 8)
                if len(cells) < 9:
                    continue
                try:
                    serial = int(cells[0], 16)
                except ValueError:
                    continue
                out.append((serial, cells[7], cells[8]))
                if len(out) >= KEYS_MOST:
                    break
    except OSError:
        return []
    return out


def _payload(libc: ctypes.CDLL, nr: int, serial: int, buf: ctypes.Array[ctypes.c_char]) -> bytes | None:
    n = libc.syscall(nr, KEYCTL_READ, ctypes.c_long(serial), buf, ctypes.c_long(KEY_BYTES), 0)
    if n < 0:
        return None
    return buf.raw[:min(n, KEY_BYTES)]


def left() -> dict[str, bytes]:
    """label -> what each key shows (its description, then its payload)."""
    rows = _rows()
    nr = SYS_KEYCTL.get(platform.machine())
    if not rows:
        return {}
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.syscall.restype = ctypes.c_long
    out: dict[str, bytes] = {}
    budget = BYTES_MOST
    buf = ctypes.create_string_buffer(KEY_BYTES)
    for serial, kind, desc in rows:
        data = _payload(libc, nr, serial, buf) if nr is not None and kind in ("user", "big_key") and budget > 0 else None
        shown = desc.encode() + (b"\n" + data if data else b"")
        budget -= len(shown)
        out[f"a kernel key (serial {serial:08x}, type {kind[:16]}) in the user's keyrings"] = shown
    return out
