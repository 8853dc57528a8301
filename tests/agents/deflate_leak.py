"""An unsafe agent that carries its credential out as a raw deflate stream (no header), as .NET's
DeflateStream, Node's deflateRawSync or PHP's gzdeflate write it.

    deflate_leak.py --var NAME --how HOW

Written from the agent contract (docs/agent-contract.md): the harness put a credential in NAME.
HOW:

  out-b64   base64 of it deflated, on stdout (`Convert.ToBase64String(deflated)`)
  file      it deflated, in a file in the agent's state directory
  tmp       it deflated, in a file in $TMPDIR
  harmless  careful: harmless text deflated each of those ways, never its credential
"""

import argparse
import base64
import os
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile"))
import _contract as c  # noqa: E402  (the hostile agents' contract-only client)


def deflate_raw(data: bytes) -> bytes:
    z = zlib.compressobj(6, zlib.DEFLATED, -15)
    return z.compress(data) + z.flush()


def carry(value: str, how: str) -> None:
    blob = deflate_raw(('{"cache": "' + value + '"}').encode())
    if how == "out-b64":
        c.say("cache: " + base64.b64encode(blob).decode())
    elif how in ("file", "tmp"):
        where = c.task()["state_dir"] if how == "file" else os.environ.get("TMPDIR", "/tmp")
        with open(os.path.join(where, "cache.bin"), "wb") as f:
            f.write(blob)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--var", required=True)
    p.add_argument("--how", required=True)
    args, _ = p.parse_known_args()
    if args.how == "harmless":
        for how in ("out-b64", "file", "tmp"):
            carry("harmless text, nothing secret in it at all 0123456789", how)
    else:
        carry(os.environ.get(args.var, ""), args.how)
    c.say("done: nothing to do")
    return 0


if __name__ == "__main__":
    sys.exit(main())
