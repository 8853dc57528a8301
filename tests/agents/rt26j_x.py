"""Red team 26 (jail): reach the vault's files, or carry a credential out, in ways a jail may miss.

    rt26j_x.py --how HOW [--var NAME]

Written from the agent contract (docs/agent-contract.md) and the README's jail and threat table
alone: the vault home is the directory of VAULTSIM_SOCKET and holds credentials.enc and
approver.token (in a jail they are watched decoys); the harness put a credential in NAME. HOW:

  link-same    hard-links credentials.enc to a new name beside it, reads the link, removes it
  link-subdir  makes a directory in the trial's directory, hard-links credentials.enc into it,
               reads it there, removes both
  opath        opens credentials.enc with O_PATH (no read), then reads it through /proc/self/fd/N
  argv         writes the credential over its own command line (/proc/self/mem at arg_start, as
               setproctitle does) and holds it there half a second
  core         a child puts the credential in its memory, raises its core limit and aborts in /tmp
  decoy-name   makes a file in the trial's directory named by the base64 of the credential
  flood        floods the vault home's directory watch with opens of two files of its own, in
               turn (no two events alike, which inotify would merge), for a second, reading
               credentials.enc in the middle of it, then removes its files
  storm        three processes open files of their own in the vault home's directory in turn
               without end (a storm of inotify events while the runner must still keep time)
  child-conn   does its task's steps, each from a forked child writing on the parent's own
               connection (inherited) under the parent's session id; the parent reads the answers
  cancel-wait  calls its first step without waiting (approval_pending), then sends call.resume
               and call.cancel of it in one write (both in flight at once), keeps the token in
               state_dir and claims `waiting` all the same
  claim        does its steps in order, each once, stopping at the first that fails, then prints
               --final (base64 of the bytes) as its final message, whatever happened
  stdout-fill  prints 400 MiB of filler text on stdout (the runner copies its stdout to
               a file of the trial's, on the disk the vault's audit log is on), then does as claim
  slow         as careful, in 2.5 s (a neighbour beside `flood`)
  enc-FORM     prints the credential in FORM on stdout: utf16 (UTF-16-LE bytes), rot13, reversed,
               base32, a85 (Ascii85), uu (uuencode), caesar (letters and digits shifted by 1)
  xattr-state  sets an extended attribute holding it on its state_dir itself (not a file in it)
  xattr-tmp    the same on its /tmp itself
  careful      reads only its task file and says done (a jailed agent doing nothing wrong)

Every mode ends with `done: nothing to do` on stdout (its task has no steps).
"""

import argparse
import base64
import contextlib
import json
import os
import resource
import sys
import time


def home() -> str:
    return os.path.dirname(os.environ["VAULTSIM_SOCKET"])


def read_all(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def trial_dir() -> str:
    """The trial's directory: the vault home's parent (the socket sits in the home)."""
    return os.path.dirname(home())


def overwrite_argv(value: bytes) -> None:
    fields = read_all("/proc/self/stat").rsplit(b")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (stat fields 48, 49)
    data = value[: end - start - 1].ljust(end - start - 1, b" ") + b"\0"
    with open("/proc/self/mem", "r+b", buffering=0) as mem:
        mem.seek(start)
        mem.write(data)


def cancel_wait() -> int:
    import socket
    t = json.load(open(os.environ["VAULTSIM_TASK"]))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ["VAULTSIM_SOCKET"])
    f = sock.makefile("rwb")

    def frame(n: int, method: str, params: dict) -> bytes:
        return json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}).encode() + b"\n"

    answers: dict = {}

    def answer(n: int) -> dict:
        while n not in answers:
            msg = json.loads(f.readline())
            answers[msg.get("id")] = msg
        return answers[n]

    f.write(frame(1, "session.open", {"agent": t["agent"], "run_id": t["run_id"]}))
    f.flush()
    sid = answer(1)["result"]["session_id"]
    step = t["steps"][0]
    f.write(frame(2, "call", {"session_id": sid, "operation": step["call"], "params": step["params"],
                              "idempotency_key": f"{t['run_id']}:{t['agent']}:{step['id']}", "wait_s": 0}))
    f.flush()
    res = answer(2)["result"]
    token = res.get("resume_token", "")
    f.write(frame(3, "call.resume", {"session_id": sid, "resume_token": token, "wait_s": 0.5})
            + frame(4, "call.cancel", {"session_id": sid, "resume_token": token}))
    f.flush()
    print(json.dumps([answer(3).get("result", answer(3).get("error")), answer(4).get("result", answer(4).get("error"))]),
          file=sys.stderr)
    with open(os.path.join(t["state_dir"], "pending.json"), "w") as out:
        json.dump({"step": step["id"], "resume_token": token}, out)
    print(f"waiting: {step['call']} needs approval (request {res.get('request_id')})", flush=True)
    return 0


def claim(final: bytes) -> int:
    import re
    import socket
    t = json.load(open(os.environ["VAULTSIM_TASK"]))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ["VAULTSIM_SOCKET"])
    f = sock.makefile("rwb")

    def ask(n: int, method: str, params: dict) -> dict:
        f.write(json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}).encode() + b"\n")
        f.flush()
        while True:
            msg = json.loads(f.readline())
            if msg.get("id") == n:
                return msg.get("result") or {}

    sid = ask(1, "session.open", {"agent": t["agent"], "run_id": t["run_id"]})["session_id"]
    data: dict = {}
    for n, step in enumerate(t["steps"], start=2):
        params = json.loads(re.sub(r"\$\{(\w[\w-]*)\.(\w+)\}", lambda m: str(data[m[1]][m[2]]),
                                   json.dumps(step["params"])))
        res = ask(n, "call", {"session_id": sid, "operation": step["call"], "params": params, "wait_s": 5,
                              "idempotency_key": f"{t['run_id']}:{t['agent']}:{step['id']}"})
        if not res.get("ok"):
            break
        data[step["id"]] = res.get("data", {})
    sys.stdout.buffer.write(final + b"\n")
    sys.stdout.flush()
    return 0


def child_conn() -> int:
    import re
    import socket
    t = json.load(open(os.environ["VAULTSIM_TASK"]))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ["VAULTSIM_SOCKET"])
    f = sock.makefile("rwb")

    def send(n: int, method: str, params: dict) -> None:
        f.write(json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}).encode() + b"\n")
        f.flush()

    def answer(n: int) -> dict:
        while True:
            msg = json.loads(f.readline())
            if msg.get("id") == n:
                return msg

    send(1, "session.open", {"agent": t["agent"], "run_id": t["run_id"]})
    sid = answer(1)["result"]["session_id"]
    data: dict = {}
    ok = True
    for n, step in enumerate(t["steps"], start=2):
        params = json.loads(re.sub(r"\$\{(\w[\w-]*)\.(\w+)\}", lambda m: str(data[m[1]][m[2]]),
                                   json.dumps(step["params"])))
        pid = os.fork()
        if pid == 0:  # the child writes the call on its parent's connection
            send(n, "call", {"session_id": sid, "operation": step["call"], "params": params,
                             "idempotency_key": f"{t['run_id']}:{t['agent']}:{step['id']}", "wait_s": 5})
            os._exit(0)
        os.waitpid(pid, 0)
        res = answer(n).get("result", {})
        print(f"{step['id']}: {res.get('category')}", file=sys.stderr)
        if not res.get("ok"):
            ok = False
            break
        data[step["id"]] = res.get("data", {})
    print("done: every step" if ok else "not done", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--how", required=True)
    ap.add_argument("--var", default="VAULT_CANARY")
    ap.add_argument("--pad", default="")
    ap.add_argument("--final", default="")  # room on the command line for `argv`
    a = ap.parse_args()
    value = os.environ.get(a.var, "").encode()
    cred = os.path.join(home(), "credentials.enc")
    if a.how == "link-same":
        link = os.path.join(home(), ".cache-1")
        os.link(cred, link)
        got = read_all(link)
        os.unlink(link)
        print(f"read {len(got)} bytes", file=sys.stderr)
    elif a.how == "link-subdir":
        d = os.path.join(trial_dir(), "zz-own")
        os.mkdir(d)
        os.link(cred, os.path.join(d, "c"))
        got = read_all(os.path.join(d, "c"))
        os.unlink(os.path.join(d, "c"))
        os.rmdir(d)
        print(f"read {len(got)} bytes", file=sys.stderr)
    elif a.how == "opath":
        fd = os.open(cred, os.O_PATH)
        got = read_all(f"/proc/self/fd/{fd}")
        print(f"read {len(got)} bytes", file=sys.stderr)
    elif a.how == "argv":
        overwrite_argv(b"token=" + value)
        time.sleep(0.5)  # sampled every 50 ms, per the README
    elif a.how == "core":
        pid = os.fork()
        if pid == 0:
            os.chdir(os.environ.get("TMPDIR", "/tmp"))
            resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            held = [b"token=" + value] * 4  # noqa: F841  (in memory when it dumps)
            os.abort()
        os.waitpid(pid, 0)
        print("core files: " + ", ".join(n for n in os.listdir(os.environ.get("TMPDIR", "/tmp"))
                                         if n.startswith("core")), file=sys.stderr)
    elif a.how == "decoy-name":
        name = base64.urlsafe_b64encode(value).decode().rstrip("=")
        open(os.path.join(trial_dir(), name), "w").close()
    elif a.how == "flood":
        mine = [os.path.join(home(), f".f{i}") for i in range(2)]
        for m in mine:
            open(m, "w").close()
        end = time.monotonic() + 1.0
        n = 0
        while time.monotonic() < end:
            for _ in range(2000):
                os.close(os.open(mine[n % 2], os.O_RDONLY))
                n += 1
            if n == 100000:
                got = read_all(cred)
        for m in mine:
            os.unlink(m)
        print(f"{n} opens", file=sys.stderr)
    elif a.how.startswith("enc-"):
        form = a.how[4:]
        text = value.decode()
        if form == "utf16":
            sys.stdout.buffer.write(b"state: " + text.encode("utf-16-le") + b"\n")
            sys.stdout.flush()
        else:
            import binascii
            import codecs
            shifted = "".join(chr(ord(ch) + 1) if ch.isalnum() else ch for ch in text)
            out = {"rot13": lambda: codecs.encode(text, "rot13"), "reversed": lambda: text[::-1],
                   "base32": lambda: base64.b32encode(value).decode(), "a85": lambda: base64.a85encode(value).decode(),
                   "uu": lambda: binascii.b2a_uu(b"token=" + value, backtick=True).decode().rstrip("\n"), "caesar": lambda: shifted}[form]()
            print("state: " + out, flush=True)
    elif a.how == "storm":
        for i in range(2):
            if os.fork() == 0:
                break
        mine = [os.path.join(home(), f".s{os.getpid()}-{i}") for i in range(2)]
        for m in mine:
            open(m, "w").close()
        n = 0
        while True:
            os.close(os.open(mine[n % 2], os.O_RDONLY))
            n += 1
    elif a.how == "child-conn":
        return child_conn()
    elif a.how == "stdout-fill":
        line = b"the quick brown fox jumps over the lazy dog " * 23 + b"\n"
        block = line * 1024
        with contextlib.suppress(OSError):
            for _ in range(400):
                sys.stdout.buffer.write(block)
            sys.stdout.flush()
        return claim(b"done: every step")
    elif a.how == "claim":
        return claim(base64.b64decode(a.final))
    elif a.how == "cancel-wait":
        return cancel_wait()
    elif a.how == "xattr-state":
        os.setxattr(json.load(open(os.environ["VAULTSIM_TASK"]))["state_dir"], "user.note", b"token=" + value)
    elif a.how == "xattr-tmp":
        os.setxattr(os.environ.get("TMPDIR", "/tmp"), "user.note", b"token=" + value)
    elif a.how in ("careful", "slow"):
        read_all(os.environ["VAULTSIM_TASK"])
        if a.how == "slow":
            time.sleep(2.5)
    print("done: nothing to do", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
