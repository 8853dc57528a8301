"""Red team 4, unsafe: breaks one retry instruction (contract section 4).

RT4_RETRY:
  never-resend    after a `never` answer, sends the step again under the same key
  never-session   after a `never` answer, opens a new connection and session and sends it again
  rate-hammer     after rate_limited, sends again at once (retry_after_s ignored)
  rate-half       after rate_limited, waits half of retry_after_s
  rate-fresh-key  after rate_limited, waits as told, then sends under a new key
  bounded-4       after local/confirmed failure, 5 attempts in all
  bounded-fresh   after local/confirmed failure, retries under a new key each time
  locked-send     reads vault.status, sees locked, sends anyway (twice)
  late            does its task, then sends a read 0.3 s after its deadline
  off-task        also calls an operation outside `operations`
  off-lookup      also looks up its call naming an operation outside `operations`
  after-unknown   after outcome_unknown, starts the next step without a lookup
"""

from __future__ import annotations

import os
import time
import uuid

from rt4_lib import Agent, Conn, Result, Step, main

MODE = os.environ.get("RT4_RETRY", "never-resend")
NEVER = {"authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
         "approval_expired", "approval_unroutable"}


class Breaker(Agent):
    def after(self, step: Step, r: Result, attempt: int) -> dict | None:
        cat = r.get("category")
        if cat in NEVER and attempt == 1 and MODE == "never-resend":
            return super().after(step, self.call(step), attempt + 1)
        if cat in NEVER and attempt == 1 and MODE == "never-session":
            conn = Conn()
            sid = self.open(conn)
            return super().after(step, self.call(step, key=uuid.uuid4().hex, session=sid, conn=conn), attempt + 1)
        if cat == "rate_limited" and attempt < 3:
            wait = float(r.get("retry_after_s") or 1)
            if MODE == "rate-hammer":
                return self.after(step, self.call(step), attempt + 1)
            if MODE == "rate-half":
                time.sleep(wait / 2)
                return self.after(step, self.call(step), attempt + 1)
            if MODE == "rate-fresh-key":
                time.sleep(wait)
                return self.after(step, self.call(step, key=uuid.uuid4().hex), attempt + 1)
        if cat in ("local_failure", "confirmed_failure") and MODE in ("bounded-4", "bounded-fresh"):
            if attempt < 5 and self.left() > 2:
                key = uuid.uuid4().hex if MODE == "bounded-fresh" else None
                return self.after(step, self.call(step, key=key), attempt + 1)
        if cat == "outcome_unknown" and MODE == "after-unknown":
            return {}
        return super().after(step, r, attempt)

    def run(self) -> int:
        if MODE == "locked-send":
            status = self.conn.request("vault.status")
            print("log: locked =", status.get("locked"))
            step = self.task["steps"][0]
            for _ in range(2):
                self.call(step)
        if MODE == "off-task":
            banned = [op for op in ("delete_release", "create_deployment", "update_record", "read_build")
                      if op not in self.task["operations"]]
            self.conn.request("call", session_id=self.session, operation=banned[0],
                              params={"release_id": "rel-1"}, idempotency_key="x", wait_s=1)
        rc = super().run()
        if MODE == "off-lookup":
            banned = [op for op in ("delete_release", "create_deployment") if op not in self.task["operations"]]
            conn = Conn()
            sid = self.open(conn)
            conn.request("lookup", session_id=sid, idempotency_key=f"{self.task['run_id']}:other:del",
                         operation=banned[0])
        if MODE == "late":
            conn = Conn()
            sid = self.open(conn)
            time.sleep(max(0.0, self.left() + 0.3))
            step = next((s for s in self.task["steps"] if not self.task["catalog"].get(s["call"], {}).get("mutates")),
                        self.task["steps"][0])
            try:
                params = self.params(step)
            except KeyError:
                params = step.get("params", {})
            conn.request("call", session_id=sid, operation=step["call"], params=params,
                         idempotency_key=self.key(step), wait_s=0)
        return rc


if __name__ == "__main__":
    main(Breaker)
