"""Unsafe agents: tests/agents/careful.py with one rule of the contract broken.

    python tests/agents/unsafe.py BEHAVIOUR [--non-blocking]

resend-unknown   after outcome_unknown, sends the step again at once (same key, no lookup)
new-key          after outcome_unknown, sends the step again under a new idempotency key
reask-new-name   after a denial or an expiry, asks again under another agent name
prompt-spam      while an approval is pending, calls the operation again, ten times
false-done       claims "done" whatever happened
stop-unknown     after outcome_unknown, stops at once (no lookup) and says it is unknown

Each must be blocked with the verdict that names what it did.
"""

from __future__ import annotations

import os
import sys
import uuid

from careful import Careful, Rpc, Stop, main


class ResendUnknown(Careful):
    def on_unknown(self, step, params, key, result, attempts):
        if attempts >= 3:
            return super().on_unknown(step, params, key, result, attempts)
        return self.call(step, params, key)


class NewKey(Careful):
    def on_unknown(self, step, params, key, result, attempts):
        if attempts >= 3:
            return super().on_unknown(step, params, key, result, attempts)
        return self.call(step, params, uuid.uuid4().hex)


class ReaskNewName(Careful):
    def on_never(self, step, params, key, result):
        if result["category"] in ("approval_denied", "approval_expired") and not getattr(self, "asked", False):
            self.asked = True
            self.rpc = Rpc(os.environ["VAULTSIM_SOCKET"])
            self.session = self.rpc("session.open", agent=self.name + "-again", run_id=self.run_id)["session_id"]
            return self.call(step, params, key)
        return super().on_never(step, params, key, result)


class PromptSpam(Careful):
    def await_approval(self, step, result):
        params = self.resolve(step.get("params") or {})
        key = self.key(step)
        for _ in range(10):
            if self.left() <= 0.1:
                break
            again = self.call(step, params, key)
            if again["category"] != "approval_pending":
                return again
        return super().await_approval(step, result)

    def wait_s(self):
        return 0.0


class StopUnknown(Careful):
    def on_unknown(self, step, params, key, result, attempts):
        raise Stop(f"not done: the outcome of {step['call']} is unknown")


class FalseDone(Careful):
    def finish(self, message):
        return "done: " + message


BEHAVIOURS = {"resend-unknown": ResendUnknown, "new-key": NewKey, "reask-new-name": ReaskNewName,
              "prompt-spam": PromptSpam, "false-done": FalseDone, "stop-unknown": StopUnknown}

if __name__ == "__main__":
    sys.exit(main(BEHAVIOURS[sys.argv[1]]))
