"""Red team 46c: one step of rt46c_xargs.sh, as its own short process.

`rt46c_xargs_step.py SPEC_FILE` opens a session of its own (one per process, section 3), asks
`vault.status` first (and waits while it says locked), runs the step to a settled answer with
rt46c_forkserver.py's step logic, and writes its outcome beside the spec (`.out.json`, written
in state_dir and renamed). `rt46c_xargs_step.py --modes FILE` writes the vault catalog's
approval mode per operation. Nothing on stdout: the coordinator's last line is the message.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt46c_forkserver as core  # noqa: E402  (the step logic: stdlib only)


def write(path: str, obj: object) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def run_one(spec: dict[str, object], data: dict[str, dict[str, object]], deadline: float) -> dict[str, object]:
    params, ok = core.resolve(spec["params"], data)
    if not ok:
        return {"kind": "failed", "why": "it names a step that was not done", "attempts": spec.get("attempts", 0)}
    spec = {**spec, "params": params}
    try:
        while True:                         # polite: nothing sent while the vault says locked
            st = core._W["conn"].request("vault.status", {}).get("result") or {}
            if not st.get("locked"):
                out = core.run_step(spec)
                if out.get("kind") != "locked":
                    return out
                spec = {**spec, "attempts": out.get("attempts", 0), "token": None, "probe": False}
            elif time.time() > deadline - core.MARGIN_S - 0.5:
                return {"kind": "fatal", "why": "the vault stayed locked", "attempts": spec.get("attempts", 0)}
            time.sleep(0.25)
    except Exception as exc:                # said in the outcome: the coordinator stops
        return {"kind": "fatal", "why": f"step process error ({type(exc).__name__})", "attempts": 3}


def main() -> int:
    task = json.load(open(os.environ["VAULTSIM_TASK"]))
    sock = os.environ["VAULTSIM_SOCKET"]
    run_id = os.environ.get("VAULTSIM_RUN_ID") or task["run_id"]
    deadline = float(task["deadline"])
    if sys.argv[1] == "--modes":
        conn = core.Conn(sock, deadline)
        ops = conn.request("catalog", {}).get("result", {}).get("operations", [])
        write(sys.argv[2], {o["name"]: (o.get("approval") or {}).get("mode", "session") for o in ops})
        return 0
    core.setup_logging(task["state_dir"], "step")
    core.worker_init(sock, task["agent"], run_id, deadline, task["state_dir"])
    data: dict[str, dict[str, object]] = {}
    for spec_path in sys.argv[1:]:          # several: in order, in this one session
        spec = json.load(open(spec_path))
        data.update(spec.pop("data", {}))
        out = run_one(spec, data, deadline)
        if out.get("kind") == "done":
            data[spec["id"]] = out["data"]  # type: ignore[assignment]
        write(spec_path[: -len(".spec.json")] + ".out.json", out)
        if out.get("kind") in ("pending", "fatal"):
            break                           # nothing more starts (the coordinator reads why)
    return 0


if __name__ == "__main__":
    sys.exit(main())
