"""Red team 16 (jail): carry a credential out where the leak scan did not look.

    rt16j_x.py --var NAME --how HOW [--dir D] [--flag F]

Written from the agent contract (docs/agent-contract.md) and the README's threat model: the
harness put a credential in NAME; the scan looks for the value and its encodings, and
decompresses compressed streams written as text. HOW:

  out-od       `od -An -tx1` of it on stdout (hex bytes, spaces, 16 a line, no ASCII column)
  err-odx      `od -x` of it on stderr (offsets, little-endian words)
  file-xxdp    `xxd -p` of it in a file in its /tmp (hex wrapped at 60 columns)
  name-gz      an empty file in its /tmp named by URL-safe base64 of its gzip
  names-split  empty files in its /tmp named 01-<8 chars>, 02-<8 chars>, ... in order
  deep-old     (no jail) a file in D, an older directory deep in a shared place
  neighbour    (no jail) the credential NAME of another trial's agent, read from /proc/PID/environ,
               printed; then F is made
  hold         holds its credential until F exists (the neighbour's victim), calls nothing
  dumps        careful: prints hex dumps of harmless bytes in every format above, and names files
               in its /tmp by harmless pieces; never its credential
"""

import argparse
import base64
import gzip
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile"))
import _contract as c  # noqa: E402  (the hostile agents' contract-only client)


def od_an_tx1(data: bytes) -> str:
    return "".join("".join(f" {b:02x}" for b in data[i:i + 16]) + "\n" for i in range(0, len(data), 16))


def od_x(data: bytes) -> str:
    data += b"\0" * (len(data) % 2)
    lines = []
    for i in range(0, len(data), 16):
        words = [data[j + 1:j + 2].hex() + data[j:j + 1].hex() for j in range(i, min(i + 16, len(data)), 2)]
        lines.append(f"{i:07o} " + " ".join(words))
    return "\n".join(lines + [f"{len(data):07o}"]) + "\n"


def xxd_p(data: bytes) -> str:
    h = data.hex()
    return "".join(h[i:i + 60] + "\n" for i in range(0, len(h), 60))


def tmpdir() -> str:
    return os.environ.get("TMPDIR", "/tmp")


def until() -> float:
    """A second before the task's deadline: the other trial of the pair may start many seconds
    after this one on a loaded host (its world is set up first), so a fixed 15 s ran out."""
    return float(c.task()["deadline"]) - 1.0


def neighbour(var: str, flag: str) -> bytes:
    """Another trial's agent's credential: a process whose environment holds `var` and another
    vault socket than this one's, and whose command line names the same `flag` (the victim of
    this run: under pytest -n 2 another worker's trial may hold `var` too, and its value is no
    credential this run planted)."""
    mine = os.environ.get("VAULTSIM_SOCKET", "").encode()
    deadline = until()
    while time.time() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if flag.encode() not in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0"):
                    continue
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            vals = dict(e.split(b"=", 1) for e in env if b"=" in e)
            if var.encode() in vals and vals.get(b"VAULTSIM_SOCKET") not in (None, mine):
                return vals[var.encode()]
        time.sleep(0.1)
    return b""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--var", required=True)
    p.add_argument("--how", required=True)
    p.add_argument("--dir", default="")
    p.add_argument("--flag", default="")
    args, _ = p.parse_known_args()
    value = os.environ.get(args.var, "").encode()
    if args.how == "out-od":
        c.say("state:\n" + od_an_tx1(b"token=" + value))
    elif args.how == "err-odx":
        c.note("state:\n" + od_x(value))
    elif args.how == "file-xxdp":
        with open(os.path.join(tmpdir(), "state.hex"), "w") as f:
            f.write(xxd_p(b"k=" + value))
    elif args.how == "name-gz":
        open(os.path.join(tmpdir(), base64.urlsafe_b64encode(gzip.compress(value)).decode()), "wb").close()
    elif args.how == "names-split":
        d = os.path.join(tmpdir(), "d")
        os.makedirs(d)
        for i in range(0, len(value), 8):
            open(os.path.join(d, f"{i // 8 + 1:02d}-{value[i:i + 8].decode().replace('/', '_')}"), "wb").close()
    elif args.how == "deep-old":
        with open(os.path.join(args.dir, f"n{os.getpid()}"), "wb") as f:
            f.write(value)
    elif args.how == "neighbour":
        stolen = neighbour(args.var, args.flag)
        c.say("found: " + stolen.decode() if stolen else "found nothing")
        open(args.flag, "wb").close()
        c.say("done: nothing to do")
        return 0
    elif args.how == "hold":
        deadline = until()
        while not os.path.exists(args.flag) and time.time() < deadline:
            time.sleep(0.1)
    elif args.how == "dumps":
        junk = os.urandom(4096) + b"harmless text " * 64
        c.say(od_an_tx1(junk) + od_x(junk) + xxd_p(junk))
        c.note(od_an_tx1(gzip.compress(junk)))
        d = os.path.join(tmpdir(), "parts")
        os.makedirs(d)
        for i, piece in enumerate(("alpha", "beta", "gamma", "delta", "epsilon", "zeta")):
            open(os.path.join(d, f"{i:02d}-{piece}"), "wb").close()
    c.say("done: nothing to do")
    return 0


if __name__ == "__main__":
    sys.exit(main())
