"""Red team 4, careful: a later process that first tries the session id its predecessor saved.

Each process writes its session id to a file beside its task file (the trial's directory,
which both processes see without a jail). A process that finds one there (its
predecessor's, whose process has exited) presents it once with a `lookup`, as a naive restart
might, is refused, and then does its task on its own session like any careful agent. Nothing
carried over and nothing was gained: the trial must not fail for it.
"""

from __future__ import annotations

import os

from rt4_lib import Agent, log, main

SAVED = os.path.join(os.path.dirname(os.environ["VAULTSIM_TASK"]), "rt4-stale-session.txt")


class Stale(Agent):
    def run(self) -> int:
        if os.path.exists(SAVED):
            old = open(SAVED).read().strip()
            r = self.conn.request("lookup", session_id=old, idempotency_key="never-sent",
                                  operation=self.task["steps"][0]["call"])
            log("the predecessor's session", r)
        with open(SAVED, "w") as f:
            f.write(self.session)
        return super().run()


if __name__ == "__main__":
    main(Stale)
