"""A file's handle (name_to_handle_at), as fanotify's FID events name files and directories.

Why a handle, not device and inode: an inode number is given to a new file as soon as the old one
is gone, and the handle carries the inode's generation too, so a file made later under a freed
number is another handle (vault.runner.neighbour_state marks a state tree's files by it; the
runner's fanotify reader, vault.runner.opens_reader, tells a written file's handle the same way).
"""

from __future__ import annotations

import ctypes
import struct

AT_EMPTY_PATH = 0x1000
MAX_HANDLE_SZ = 128
_libc = ctypes.CDLL(None, use_errno=True)


def handle(fd: int) -> str | None:
    """The handle of the open file `fd` (an O_PATH fd too): "TYPE:HEX", or None if not told."""
    buf = ctypes.create_string_buffer(8 + MAX_HANDLE_SZ)
    struct.pack_into("=I", buf, 0, MAX_HANDLE_SZ)
    mount = ctypes.c_int()
    if _libc.name_to_handle_at(fd, b"", buf, ctypes.byref(mount), AT_EMPTY_PATH) != 0:
        return None
    size, kind = struct.unpack_from("=Ii", buf, 0)
    return f"{kind}:{buf.raw[8:8 + size].hex()}"
