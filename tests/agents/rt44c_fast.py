"""Red team 44c: a very fast agent, written from docs/agent-contract.md alone (stdlib).

`session.open`, `vault.status` and `catalog` written in one write; then each run of consecutive
steps whose operation the catalog calls `approval.mode: auto` and non-mutating, that name no
result of the run and are not alike (section 3: those may go out together), written all at once
on the one connection, with no pause; the answers taken by id as they come and each settled in
order by rt44c_lib's rules (an `outcome_unknown` looked up before anything else, a `never` answer
stops what is not yet sent). Every other step alone, blocking, with a margin of 0.4 s.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt44c_lib as lib  # noqa: E402


def main() -> int:
    task = lib.load_task()
    vault = lib.Vault(os.environ["VAULTSIM_SOCKET"], float(task["deadline"]))
    # three requests in one write: the session needs no answer before status and catalog
    frames = [{"jsonrpc": "2.0", "id": i, "method": m, "params": p} for i, (m, p) in enumerate([
        ("session.open", {"agent": task["agent"], "run_id": task["run_id"], "client": {"name": "rt44c-fast"}}),
        ("vault.status", {}), ("catalog", {})], start=1)]
    vault.sock.sendall("".join(json.dumps(f) + "\n" for f in frames).encode())
    vault.next_id = 3
    opened, status, catalog = vault.wait(1), vault.wait(2), vault.wait(3)
    ops = {o.get("name"): o for o in catalog.get("operations") or [] if isinstance(o, dict)}
    print(f"fast: vault locked={status.get('locked')}, {len(ops)} operations", file=sys.stderr)

    # a Runner set up by hand: its session is the one opened in the first write
    runner = lib.Runner.__new__(lib.Runner)
    runner.task, runner.deadline, runner.margin = task, float(task["deadline"]), 0.4
    runner.blocking, runner.poll_s = True, 0.5
    runner.log = lambda s: print(f"[fast] {s}", file=sys.stderr, flush=True)
    runner.vault, runner.journal, runner.sid = vault, lib.Journal(task["state_dir"]), str(opened["session_id"])
    runner.results = {k: r["data"] for k, r in runner.journal.data["steps"].items() if "data" in r}
    runner.outcome = {k: "done" for k in runner.results}
    runner.waiting, runner.refs, runner.stop_reason = [], {}, None

    def batchable(s: dict[str, Any]) -> bool:
        op = ops.get(s["call"]) or {}
        return (op.get("approval") or {}).get("mode") == "auto" and op.get("mutates") is False

    steps = task.get("steps") or []
    try:
        i = 0
        while i < len(steps):
            s = steps[i]
            if runner.outcome.get(s["id"]) == "done":
                i += 1
                continue
            if any(runner.outcome.get(r) != "done" for r in lib.refs(s.get("params"))):
                runner.outcome[s["id"]] = "failed"
                i += 1
                continue
            rec = runner.journal.step(s["id"])
            if not batchable(s) or rec:          # a restart's step with a history: its own way
                runner.run_step(s)
                i += 1
                if runner.waiting:
                    break
                continue
            group = [s]
            i += 1
            while i < len(steps) and batchable(steps[i]) and not runner.journal.data["steps"].get(steps[i]["id"]):
                t = steps[i]
                if lib.refs(t.get("params")) & {g["id"] for g in group} or any(
                        g["call"] == t["call"] and g.get("params") == t.get("params") for g in group) \
                        or runner.outcome.get(t["id"]) == "done":
                    break
                group.append(t)
                i += 1
            for g in group:
                r = runner.journal.step(g["id"])
                r["sent"], r["attempts"] = True, 1
            runner.journal.save()
            ids = [vault.send("call", {"session_id": runner.sid, "operation": g["call"],
                                       "params": runner.params_of(g), "idempotency_key": runner.key(g),
                                       "wait_s": runner.wait_s()}) for g in group]
            answers = []
            for rid in ids:
                try:
                    answers.append(vault.wait(rid))
                except lib.VaultError as e:
                    answers.append({"category": "refused", "retry": "never", "message": str(e)})
            for g, ans in zip(group, answers):
                if ans.get("category") == "refused":
                    runner.fail(g["id"], ans["message"])
                    continue
                runner.run_step(g, first=ans)
        final = runner.message()
    except lib.Finish as f:
        final = str(f)
    runner.close()
    print(final, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
