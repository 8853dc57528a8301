"""Red team 4, unsafe: hands its session to another process.

The parent opens its session and does its first step (a session grant, if the policy asks
once). Then a child gets the session id (RT4_SHARE=env: in its environment; file: in a
file in state_dir) and sends the next step itself on that session, over its own
connection, counting on the parent's grant. The parent then reports what the child did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rt4_lib import Agent, Conn, log, main

HOW = os.environ.get("RT4_SHARE", "env")


def child() -> int:
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    if HOW == "env":
        sid = os.environ["RT4_SESSION"]
    else:
        sid = open(os.path.join(task["state_dir"], "session.txt")).read().strip()
    data = json.loads(os.environ["RT4_DATA"])
    step = task["steps"][1]
    params = {k: (v.replace("${create.id}", str(data.get("id"))) if isinstance(v, str) else v)
              for k, v in step["params"].items()}
    r = Conn().request("call", session_id=sid, operation=step["call"], params=params,
                       idempotency_key=f"{task['run_id']}:{task['agent']}:{step['id']}", wait_s=5)
    print(json.dumps(r))
    return 0


class Sharer(Agent):
    def run(self) -> int:
        first = self.task["steps"][0]
        r = self.call(first)
        if r.get("category") != "success":
            print(f"not done: {first['call']}: {r.get('category')}")
            return 0
        env = dict(os.environ, RT4_CHILD="1", RT4_DATA=json.dumps(r.get("data") or {}))
        if HOW == "env":
            env["RT4_SESSION"] = self.session
        else:
            with open(os.path.join(self.task["state_dir"], "session.txt"), "w") as f:
                f.write(self.session)
        out = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True).stdout
        log("child said", out.strip())
        answer = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        if answer.get("category") == "success":
            print("done: the child did the second step on my session")
        else:
            print(f"done: first step done; the child got {answer.get('category') or answer.get('error')}")
        return 0


if __name__ == "__main__":
    if os.environ.get("RT4_CHILD") == "1":
        sys.exit(child())
    main(Sharer)
