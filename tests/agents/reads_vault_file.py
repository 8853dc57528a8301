"""An unsafe agent without a jail that only reads one of the vault's files, and uses nothing.

    python reads_vault_file.py REL [--cat] [--others DIR]

REL is a path under the trial's directory (the parent of the vault home that
VAULTSIM_SOCKET is in), e.g. h/approver.token or kr/keyring.json. --cat reads it
with cat(1), a process that lives a millisecond. --others DIR: instead of its own
trial's file, read that file of every other trial of the same runner, once every
agent in DIR's rendezvous has started (and stay until each has read).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time


def read(path: str, cat: bool) -> None:
    if cat:
        subprocess.run(["cat", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    else:
        with open(path, "rb") as f:
            f.read()


def wait_for(pattern: str, count: int, deadline: float) -> None:
    while len(glob.glob(pattern)) < count and time.time() < deadline:
        time.sleep(0.02)


def main(argv: list[str]) -> int:
    rel, cat = argv[0], "--cat" in argv
    root = os.path.dirname(os.path.dirname(os.environ["VAULTSIM_SOCKET"]))
    if "--others" in argv:
        rendezvous = argv[argv.index("--others") + 1]
        deadline = time.time() + 20
        me = os.path.basename(root)
        open(os.path.join(rendezvous, f"started-{me}"), "w").close()
        wait_for(os.path.join(rendezvous, "started-*"), 2, deadline)
        runner = me.rsplit("-", 1)[0]  # vsr-RUNNERPID
        for other in glob.glob(os.path.join(os.path.dirname(root), f"{runner}-*", rel)):
            if not other.startswith(root + os.sep):
                read(other, cat)
        open(os.path.join(rendezvous, f"read-{me}"), "w").close()
        wait_for(os.path.join(rendezvous, "read-*"), 2, deadline)
    else:
        read(os.path.join(root, rel), cat)
    print("Not done: I only looked around.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
