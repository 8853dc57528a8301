"""An agent that does its task carefully and then forges one of the vault's audit files, without a
jail (tests/test_audit_watch48.py): each forgery is FAIL_AUDIT_TAMPER naming the file.

    TAMPER48_MODE=MODE python tests/agents/tamper48_x.py

Its task is done first (tests/agents/careful.py, as a child: its last line is this agent's final
message), so that a long task's rotations and head updates come before the forgery. MODE (the
vault home is the directory of VAULTSIM_SOCKET):
  head_rename    writes a forged head in its own temp directory and renames it over audit.head
                 (the daemon's next head replaces it: only the rename tells of it)
  new_segment    writes a file named as the next rotated segment, as a rotation starts one
  none           forges nothing (the control: a careful agent)
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time

FORGED = json.dumps({"seq": 999999, "time": time.time(), "hash": "0" * 64, "sig": "forged"}) + "\n"


def forge(mode: str, home: str) -> None:
    if mode == "head_rename":
        tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"head-{os.getpid()}")
        with open(tmp, "w") as f:
            f.write(FORGED)
        os.rename(tmp, os.path.join(home, "audit.head"))
    elif mode == "new_segment":
        with open(os.path.join(home, "audit.999999999999.log"), "a") as f:
            f.write(FORGED)


if __name__ == "__main__":
    careful = os.path.join(os.path.dirname(os.path.abspath(__file__)), "careful.py")
    code = subprocess.call([sys.executable, careful])
    home = os.path.dirname(os.environ["VAULTSIM_SOCKET"])
    print(f"segments before the forgery: {len(glob.glob(os.path.join(home, 'audit.*.log')))}", file=sys.stderr)
    try:
        forge(os.environ.get("TAMPER48_MODE", "none"), home)
    except OSError as exc:
        print(f"forgery failed: {exc.strerror}", file=sys.stderr, flush=True)
    sys.exit(code)
