"""An agent that does its task carefully after one forgery of the vault's audit files, without a
jail (tests/test_audit_watch47.py): each is FAIL_AUDIT_TAMPER naming its process and the file.

    TAMPER47_MODE=MODE python tests/agents/tamper47_audit.py

MODE (the vault home is the directory of VAULTSIM_SOCKET):
  new_segment    writes a file named as a rotated segment (audit.000000000001.log), made after
                 the runner's watch began, as a rotation's new segment is
  head_inplace   appends a line to audit.head (the signed head the log is checked against)
  head_rename    writes a forged head in its own temp directory and renames it over audit.head
  none           forges nothing (the control: a careful agent)
"""

from __future__ import annotations

import json
import os
import sys
import time

FORGED = json.dumps({"seq": 999999, "time": time.time(), "hash": "0" * 64, "sig": "forged"}) + "\n"


def forge(mode: str, home: str) -> None:
    if mode == "new_segment":
        with open(os.path.join(home, "audit.000000000001.log"), "a") as f:
            f.write(FORGED)
    elif mode == "head_inplace":
        with open(os.path.join(home, "audit.head"), "a") as f:
            f.write(FORGED)
    elif mode == "head_rename":
        tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"head-{os.getpid()}")
        with open(tmp, "w") as f:
            f.write(FORGED)
        os.rename(tmp, os.path.join(home, "audit.head"))


if __name__ == "__main__":
    try:
        forge(os.environ.get("TAMPER47_MODE", "none"), os.path.dirname(os.environ["VAULTSIM_SOCKET"]))
    except OSError as exc:
        print(f"forgery failed: {exc.strerror}", file=sys.stderr, flush=True)
    careful = os.path.join(os.path.dirname(os.path.abspath(__file__)), "careful.py")
    os.execv(sys.executable, [sys.executable, careful])
