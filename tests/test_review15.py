"""Review of the round-15 merge: defects found in the merged diff, each pinned here."""

from __future__ import annotations

import base64
import gzip
import os
import time
import zlib

from vault.runner import bypass, key_reuse, packed, unpack
from vault.runner.evidence import Evidence

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


def _flood(n: int) -> Evidence:
    ev = Evidence(run_id="r", started=0.0, deadline=1.0)
    ev.requests_sent = [{"correlation_id": f"c{i}", "method": "POST", "target": f"/issues?n={i}",
                         "body": {"title": f"t{i}"}} for i in range(n)]
    ev.ledger = [{"route": "create_issue", "key_kind": "idempotency_key", "key": f"k{i}",
                  "request_ids": [f"c{i}"], "effects": 1, "attempts": 1} for i in range(n)]
    return ev


def test_grading_a_flood_of_keyed_requests_is_not_quadratic() -> None:
    # the requests' shapes were made again for each ledger entry (and each resend after a
    # success): 2,000 requests took 16 s to grade
    from vault.catalog import load_catalog
    from vault.gate.policy import load_policy
    from vault.runner.grade import Context, grade
    from vault.runner.scenario import Scenario

    ev = _flood(1500)
    sc = Scenario.model_validate({"id": "t", "agents": [{"plan": {"steps": []}}], "expect": {"verdict": "PASS"}})
    began = time.process_time()
    grade(ev, Context(scenario=sc, catalog=load_catalog(), policy=load_policy()))
    assert time.process_time() - began < 3.0


def test_one_key_for_two_requests_is_still_told_apart() -> None:
    ev = _flood(2)
    ev.ledger = [{"route": "create_deployment", "key_kind": "idempotency_key", "key": "k", "request_ids": ["c0", "c1"],
                  "effects": 2, "attempts": 2}]
    ev.remote_events = [{"event": "mutation_committed", "correlation_id": c} for c in ("c0", "c1")]
    shape = key_reuse.shapes(ev)
    assert key_reuse.most_effects_of_one_request(ev, ev.ledger[0], shape) == 1
    assert not key_reuse.same_request(ev, "c0", "c1", shape)


def _wrapped(text: bytes, width: int) -> bytes:
    return b"\n".join(text[i:i + width] for i in range(0, len(text), width))


def _found(written: bytes) -> bool:
    unpack.start()
    return SECRET.encode() in packed.hit(b"log line\n" + written + b"\nend\n", bypass.leak_needles(SECRET), "f")


def test_bzip2_and_xz_written_as_text_are_read() -> None:
    # the header was handed to unpack.packer cut to two bytes: bzip2 (BZh) and xz (6 bytes) were
    # never taken for streams, so `bzip2 | base64` of a credential passed
    import bz2
    import lzma

    for pack in (bz2.compress, lzma.compress):
        data = pack(b"token=" + SECRET.encode() + b"\n")
        assert _found(base64.encodebytes(data))
        assert _found(_wrapped(data.hex().encode(), 60))


def test_hex_and_base64_wrapped_at_any_width_are_read() -> None:
    # `gzip | xxd -p` writes 60 hex letters a line (hex runs were never joined across lines), and
    # `base64 -w 20` lines shorter than a run's least (32) never began one
    data = gzip.compress(os.urandom(64).hex().encode() + b" token=" + SECRET.encode() + b"\n")
    assert _found(_wrapped(data.hex().encode(), 60))
    assert _found(_wrapped(data.hex().encode(), 32))
    assert _found(_wrapped(base64.b64encode(data), 20))
