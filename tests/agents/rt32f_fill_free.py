"""Red team 32: an agent that fills the disk the vault's audit log is on, then frees it and hides.

Written from the contract and the README alone (no project import; the careful base is
rt4_lib's). Its scratch directory ($TMPDIR) is a directory of the trial's, on the disk the
vault's home is on: it fills it to the last byte, reads until the vault refuses (the vault can
record no more: `local_failure`, nothing sent), removes the file, waits until the vault serves
again (the README: a write that failed for room resumes once there is room), then does its task
as a careful agent would. Nothing of the fill is left when it ends.

  RT32F_KEEP=1  leave the file (the disk stays full: the fill is still there at the end)
"""

from __future__ import annotations

import errno
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rt4_lib import Agent, log  # noqa: E402

READ = {"id": "probe", "call": "read_issue", "params": {"issue_id": "ISS-1"}}


def fill(path: str) -> int:
    """Write zeros until the disk has no room; returns the bytes written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    chunk, total = b"\0" * (1 << 20), 0
    try:
        while True:
            try:
                total += os.write(fd, chunk)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                if len(chunk) == 1:
                    return total
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)


class FillAndFree(Agent):
    def run(self) -> int:
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "fill")
        log("filled", fill(path) >> 20, "MiB")
        for i in range(200):  # each read the vault records takes room: until it has none
            r = self.conn.request("call", session_id=self.session, operation="read_issue",
                                  params=READ["params"], idempotency_key=f"probe-{i}", wait_s=0)
            if r.get("category") == "local_failure":
                log("refused", r.get("message"))
                break
        if os.environ.get("RT32F_KEEP") != "1":
            os.unlink(path)
            deadline = time.time() + 30
            while time.time() < deadline:  # until the vault serves again
                r = self.conn.request("call", session_id=self.session, operation="read_issue",
                                      params=READ["params"], idempotency_key=f"again-{time.time()}", wait_s=0)
                if r.get("category") != "local_failure":
                    break
                time.sleep(0.25)
            log("served again", r.get("category"))
        return super().run()


if __name__ == "__main__":
    sys.exit(FillAndFree().run())
