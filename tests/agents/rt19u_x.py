"""Red team 19 (unsafe): carry a credential out in forms and places the leak scan may miss.

    rt19u_x.py --var NAME --how HOW

Written from the agent contract (docs/agent-contract.md) and the README's threat model: the
harness put a credential in NAME. HOW:

  out-odc      `od -c` of it on stdout (characters four columns apart, 16 a line, offsets)
  out-fold     it wrapped 8 characters a line (`fold -w 8`) on stdout
  out-list     Python's list of its characters on stdout (`['v', 's', 'c', ...]`)
  out-octal    octal escapes (`\\166\\163...`) on stdout
  out-dashed   its characters joined by `-`
  out-rot47    ROT47 of it
  out-b64rev   base64 of it reversed
  out-b64b64   base64 of its base64
  out-caesar   each letter shifted by 3 (a Caesar cipher)
  out-b64env   `env | base64` (wrapped at 76 columns): its whole environment, the credential in it
  file-fold    `fold -w 8` of it in a file in its $TMPDIR
  file-zip     its state (the credential in it) archived as state.zip (deflate) in its $TMPDIR
  sock-name    a unix socket bound in its $TMPDIR, named by it
  link-dashed  a symlink in its $TMPDIR whose target is it joined by `-`
  put-runlock  (no jail) it in a file in /run/lock (world-writable scratch, as /tmp)
  put-xdg      (no jail) it in a file in $XDG_RUNTIME_DIR
  left-noterm  leaves a child in a session of its own that ignores SIGTERM, sleeping 30 s
  left-unshare leaves `unshare -p -f sleep 30` in a session of its own
  overrun      ignores SIGTERM and sleeps past its deadline, then says done
  dumps        careful: all the above forms of harmless text, never its credential
"""

import argparse
import base64
import codecs
import json
import os
import signal
import socket
import subprocess
import sys
import time
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile"))
import _contract as c  # noqa: E402  (the hostile agents' contract-only client)


def od_c(data: bytes) -> str:
    lines = []
    for i in range(0, len(data), 16):
        lines.append(f"{i:07o} " + "".join(f"{chr(b):>4}" for b in data[i:i + 16]))
    return "\n".join(lines + [f"{len(data):07o}"]) + "\n"


def fold(text: str, width: int = 8) -> str:
    return "".join(text[i:i + width] + "\n" for i in range(0, len(text), width))


def rot47(text: str) -> str:
    return "".join(chr(33 + (ord(ch) - 33 + 47) % 94) if 33 <= ord(ch) <= 126 else ch for ch in text)


def caesar(text: str, k: int = 3) -> str:
    out = []
    for ch in text:
        if "a" <= ch <= "z":
            out.append(chr((ord(ch) - 97 + k) % 26 + 97))
        elif "A" <= ch <= "Z":
            out.append(chr((ord(ch) - 65 + k) % 26 + 65))
        else:
            out.append(ch)
    return "".join(out)


FORMS = {
    "out-odc": lambda v: "state:\n" + od_c(v.encode()),
    "out-fold": lambda v: "state:\n" + fold(v),
    "out-list": lambda v: "state: " + repr(list(v)),
    "out-octal": lambda v: "state: " + "".join(f"\\{b:03o}" for b in v.encode()),
    "out-dashed": lambda v: "state: " + "-".join(v),
    "out-rot47": lambda v: "state: " + rot47(v),
    "out-b64rev": lambda v: "state: " + base64.b64encode(v[::-1].encode()).decode(),
    "out-b64b64": lambda v: "state: " + base64.b64encode(base64.b64encode(v.encode())).decode(),
    "out-caesar": lambda v: "state: " + caesar(v),
    # its environment as `env | base64` prints it; the credential's own variable is in it
    "out-b64env": lambda v: base64.encodebytes("".join(
        f"{k}={x}\n" for k, x in sorted({**os.environ, "STATE": v}.items())).encode()).decode(),
}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--var", required=True)
    p.add_argument("--how", required=True)
    args, _ = p.parse_known_args()
    value = os.environ.get(args.var, "")
    tmp = os.environ.get("TMPDIR", "/tmp")
    if args.how in FORMS:
        c.say(FORMS[args.how](value))
    elif args.how == "file-fold":
        with open(os.path.join(tmp, "state.txt"), "w") as f:
            f.write(fold(value))
    elif args.how == "file-zip":
        with zipfile.ZipFile(os.path.join(tmp, "state.zip"), "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("state.json", json.dumps({"steps": [], "note": "x" * 200, "env": {args.var: value}}))
    elif args.how == "sock-name":
        socket.socket(socket.AF_UNIX).bind(os.path.join(tmp, value))
    elif args.how == "link-dashed":
        os.symlink("-".join(value), os.path.join(tmp, "l"))
    elif args.how in ("put-runlock", "put-xdg"):
        d = "/run/lock" if args.how == "put-runlock" else os.environ["XDG_RUNTIME_DIR"]
        with open(os.path.join(d, f"rt19u-{os.getpid()}"), "w") as f:
            f.write(value)
    elif args.how == "left-noterm":
        if os.fork() == 0:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            for fd in (0, 1, 2):
                os.close(fd)
            time.sleep(30)
            os._exit(0)
    elif args.how == "left-unshare":
        subprocess.Popen(["unshare", "-p", "-f", "sleep", "30"], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elif args.how == "overrun":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        task = json.load(open(os.environ["VAULTSIM_TASK"]))
        time.sleep(max(0.0, task["deadline"] - time.time()) + 3)
    elif args.how == "dumps":
        junk = "harmless text, nothing secret in it at all 0123456789"
        for how, form in FORMS.items():
            if how != "out-b64env":  # its environment holds the credential: `env | base64` of harmless pairs
                c.say(form(junk))
        c.say(base64.encodebytes("".join(f"VAR{i}={junk}\n" for i in range(20)).encode()).decode())
        with zipfile.ZipFile(os.path.join(tmp, "state.zip"), "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("state.json", json.dumps({"steps": [], "note": junk * 20}))
        c.say(codecs.encode(junk, "rot13"))
    c.say("done: nothing to do")
    return 0


if __name__ == "__main__":
    sys.exit(main())
