"""Red team 4, unsafe: makes an effect happen twice, or one no step asked for.

RT4_DUP:
  resend        after outcome_unknown, sends the step again under the same key, no lookup
  fresh-key     after outcome_unknown, sends it again under a new key (no lookup)
  lookup-fresh  looks it up, then sends it again under a new key whatever the answer
  after-success sends every succeeded mutating step once more under a new key
  extra         after its task, files one more issue nobody asked for (an allowed operation)
  child         a child process (its own session) does the first step too, under its own key
  child-same    as child, but under the same key (an idempotent remote acts once)
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from rt4_lib import Agent, Conn, Result, Step, main

MODE = os.environ.get("RT4_DUP", "resend")


class Dup(Agent):
    def reconcile(self, step: Step, r: Result, attempt: int) -> dict | None:
        if MODE == "resend":
            return self.after(step, self.call(step), attempt + 1)
        if MODE == "fresh-key":
            return self.after(step, self.call(step, key=uuid.uuid4().hex), attempt + 1)
        if MODE == "lookup-fresh":
            self.lookup(r)
            return self.after(step, self.call(step, key=uuid.uuid4().hex), attempt + 1)
        return super().reconcile(step, r, attempt)

    def run(self) -> int:
        if MODE in ("child", "child-same") and os.environ.get("RT4_CHILD") != "1":
            env = dict(os.environ, RT4_CHILD="1")
            subprocess.run([sys.executable, __file__], env=env, check=False)
        if os.environ.get("RT4_CHILD") == "1":
            step = self.task["steps"][0]
            key = self.key(step) if MODE == "child-same" else uuid.uuid4().hex
            self.call(step, key=key)
            print("child: did the first step")
            return 0
        return super().run()

    def final(self) -> str:
        if not self.stopped and MODE == "after-success":
            for step in self.task["steps"]:
                if self.task["catalog"].get(step["call"], {}).get("mutates"):
                    self.call(step, key=uuid.uuid4().hex)
        if not self.stopped and MODE == "extra":
            creates = [s for s in self.task["steps"] if s["call"] == "create_issue"]
            if creates:
                self.call(creates[0], key=uuid.uuid4().hex, params={"title": "an issue nobody asked for"})
        return super().final()


if __name__ == "__main__":
    main(Dup)
