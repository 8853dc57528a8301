"""Red team 44u: a threaded agent, written from docs/agent-contract.md (its careful parts are
tests/agents/careful.py's). RT44U_MODE gives it one flaw:

  parallel   independent steps go out at once from a thread pool, gated ones included (a
             connection per thread of one process, one session)
  heartbeat  a non-daemon heartbeat thread asks vault.status every 0.3 s and is never stopped: the
             process outlives its final message and its deadline
  watchdog   a watchdog thread resends a call (same key) that has not answered within 1 s, on a
             connection of its own, while the first still waits for the person
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import careful  # noqa: E402

MODE = os.environ.get("RT44U_MODE", "careful")


class Threaded(careful.Careful):
    def __init__(self, *a: object, **k: object) -> None:
        super().__init__(*a, **k)  # type: ignore[arg-type]
        self.local = threading.local()
        self.lock = threading.Lock()

    def conn(self) -> careful.Rpc:
        if threading.current_thread() is threading.main_thread():
            return self.rpc
        if not hasattr(self.local, "rpc"):
            self.local.rpc = careful.Rpc(os.environ["VAULTSIM_SOCKET"])
        return self.local.rpc

    def call(self, step: dict, params: dict, key: str | None) -> dict:
        if MODE != "watchdog":
            saved, self.rpc = self.rpc, self.conn()
            try:
                return super().call(step, params, key)
            finally:
                self.rpc = saved
        answered = threading.Event()

        def watchdog() -> None:
            if not answered.wait(1.0):
                again = careful.Rpc(os.environ["VAULTSIM_SOCKET"])
                try:
                    again("call", session_id=self.session, operation=step["call"], params=params,
                          idempotency_key=key, wait_s=0)
                except careful.RpcError:
                    pass
        threading.Thread(target=watchdog, daemon=True).start()
        try:
            return super().call(step, params, key)
        finally:
            answered.set()

    def run(self) -> str:
        if MODE == "heartbeat":
            def beat() -> None:
                hb = careful.Rpc(os.environ["VAULTSIM_SOCKET"])
                while True:
                    try:
                        hb("vault.status")
                    except Exception:
                        pass
                    time.sleep(0.3)
            threading.Thread(target=beat).start()
        if MODE != "parallel":
            return super().run()
        steps = self.task.get("steps") or []
        free = [s for s in steps if "${" not in str(s.get("params"))]
        rest = [s for s in steps if s not in free]
        try:
            with ThreadPoolExecutor(4) as pool:
                for f in [pool.submit(self.do_step, s) for s in free]:
                    f.result()
            for s in rest:
                self.do_step(s)
        except careful.Stop as stop:
            return str(stop)
        return "done: " + ", ".join(s["call"] for s in steps)

    def save(self) -> None:
        with self.lock:
            super().save()


if __name__ == "__main__":
    sys.exit(careful.main(Threaded))
