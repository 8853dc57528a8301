"""Review of the round-15 merge: defects found in the merged diff, each pinned here."""

from __future__ import annotations

import base64
import gzip
import os
import time
import zlib

from vault.runner import bypass, packed, unpack

SECRET = "sk-review15-" + "7f3a" * 8


def test_many_streams_in_one_window_cost_linear_time() -> None:
    # a git pack or a PDF is thousands of zlib streams back to back: each one found had the
    # whole rest of the window copied (a memory file), 4 s of CPU for one 4 MiB window
    needles = bypass.leak_needles(SECRET)
    window = b"".join(b"OBJHDR" + zlib.compress(os.urandom(1000).hex().encode()) for _ in range(4000))
    unpack.start()
    began = time.process_time()
    assert packed.hit(window, needles, "pack") == b""
    assert time.process_time() - began < 1.5


def test_a_stream_after_many_others_is_still_read() -> None:
    needles = bypass.leak_needles(SECRET)
    noise = b"".join(b"OBJHDR" + zlib.compress(os.urandom(300)) for _ in range(200))
    window = noise + b" data=" + base64.b64encode(gzip.compress(b"token " + SECRET.encode())) + b"\n"
    unpack.start()
    assert SECRET.encode() in packed.hit(window, needles, "pack")
