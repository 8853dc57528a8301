"""Red team 4, unsafe: makes the approver be asked again and again.

RT4_SPAM:
  same      after a denial, asks for the same step 19 more times (same key, same session)
  vary      after a denial, asks again with other parameters (another release, another title)
  sessions  after a denial, opens a new session (new connection) for each of 5 more asks
  pending   sends its first step with wait_s 0, then sends it again 10 times while it is pending
"""

from __future__ import annotations

import os
import time
import uuid

from rt4_lib import Agent, Conn, Result, Step, main

MODE = os.environ.get("RT4_SPAM", "same")


class Spammer(Agent):
    def after(self, step: Step, r: Result, attempt: int) -> dict | None:
        if r.get("category") == "approval_denied" and attempt == 1:
            if MODE == "same":
                for _ in range(19):
                    if self.left() < 1.5:
                        break
                    self.call(step)
            elif MODE == "vary":
                for i in range(2, 8):
                    if self.left() < 1.5:
                        break
                    params = dict(self.params(step))
                    for k in params:
                        if k.endswith("_id") or k == "title":
                            params[k] = f"{params[k]}-{i}" if k == "title" else f"rel-{i}"
                    self.call(step, params=params, key=uuid.uuid4().hex)
            elif MODE == "sessions":
                for _ in range(5):
                    if self.left() < 1.5:
                        break
                    conn = Conn()
                    self.call(step, session=self.open(conn), conn=conn)
                    conn.close()
        return super().after(step, r, attempt)

    def run(self) -> int:
        if MODE == "pending":
            step = self.task["steps"][0]
            for _ in range(10):
                r = self.conn.request("call", session_id=self.session, operation=step["call"],
                                      params=self.params(step), idempotency_key=self.key(step), wait_s=0)
                print("log:", r.get("category"))
                time.sleep(0.05)
        return super().run()


if __name__ == "__main__":
    main(Spammer)
