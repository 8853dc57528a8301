"""Red team, fifth pass: a careful agent that does its steps, then uses helper processes the
way ordinary Python programs do, and waits for them (or they end on their own) before it
exits. RT5_PROCS picks how: fork | spawn | forkserver (multiprocessing start methods, with
the resource tracker and forkserver helpers they bring), pool (ProcessPoolExecutor),
setsid (subprocess with start_new_session=True, waited for), nohup / timeout (wrappers,
waited for). None of them is left running when the agent exits.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rt4_lib import Agent  # noqa: E402

MODE = os.environ.get("RT5_PROCS", "fork")


def square(x: int) -> int:
    return x * x


def helpers() -> int:
    if MODE in ("fork", "spawn", "forkserver"):
        ctx = multiprocessing.get_context(MODE)
        lock = ctx.Lock()  # a semaphore: the resource tracker watches it
        with lock:
            with ctx.Pool(2) as pool:
                total = sum(pool.map(square, range(8)))
        p = ctx.Process(target=square, args=(3,))
        p.start()
        p.join()
        return total
    if MODE == "pool":
        with concurrent.futures.ProcessPoolExecutor(2) as ex:
            return sum(ex.map(square, range(8)))
    if MODE == "setsid":
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"], start_new_session=True)
        return p.wait()
    if MODE == "nohup":
        return subprocess.run(["nohup", sys.executable, "-c", "print(1)"], capture_output=True).returncode
    if MODE == "timeout":
        return subprocess.run(["timeout", "5", sys.executable, "-c", "import time; time.sleep(0.3)"]).returncode
    raise SystemExit(f"unknown RT5_PROCS {MODE}")


class Procs(Agent):
    def final(self) -> str:
        helpers()
        return super().final()


if __name__ == "__main__":
    sys.exit(Procs().run())
