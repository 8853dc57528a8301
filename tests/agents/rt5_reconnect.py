"""Red team, fifth pass: a careful agent whose connection drops between steps (here it
closes it itself, as a proxy or a restarted connection pool would) and reconnects.

The contract: a session ends when the connection that opened it closes. RT5_RECONNECT:
  new     open a new session on the new connection (what the contract implies)
  old     first present the old session id on the new connection, in a read-only
          `vault.status`-like probe: a `lookup` of the last call; when the vault answers
          with an error or refuses it, open a new session
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rt4_lib import Agent, Conn, Result, Step, log  # noqa: E402

MODE = os.environ.get("RT5_RECONNECT", "new")


class Reconnect(Agent):
    dropped = False
    last: Result | None = None

    def call(self, step: Step, **kw: object) -> Result:
        if self.data and not self.dropped:  # after the first step: the connection drops
            self.dropped = True
            self.conn.close()
            self.conn = Conn()
            if MODE == "old" and self.last is not None:
                r = self.conn.request("lookup", session_id=self.session, correlation_id=self.last["correlation_id"],
                                      operation=self.last["operation"])
                log("old session after reconnect:", r.get("category") or r.get("error"))
            self.session = self.open(self.conn)
        r = super().call(step, **kw)  # type: ignore[arg-type]
        self.last = r
        return r


if __name__ == "__main__":
    sys.exit(Reconnect().run())
