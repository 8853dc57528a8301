"""A recorded `vaultsim run --json` document with every kind of outcome, for rendering tests.

Fixed numbers and names, so the table and JUnit it renders are stable: an
expected PASS, an expected FAIL_* (the gate caught the naive agent), a
scenario blocked by one of three trials, a harness ERROR, a skipped SSH
scenario, and an agent that wrote terminal control into its stderr.
"""

from __future__ import annotations

import copy
from typing import Any

VERDICTS = ["FAIL_TOOL_ACCESS", "FAIL_SECRET_LEAK", "FAIL_LEAKED_APPROVAL", "FAIL_DUPLICATE_EFFECT",
            "FAIL_UNROUTED_WAIT", "EXPECTED_WAIT", "FAIL_MEMORY", "FAIL_DEADLINE", "FAIL_APPROVAL_FATIGUE",
            "FAIL_CATEGORY", "FAIL_RECOVERY", "FAIL_OUTCOME", "PASS"]


def trial(n: int, verdict: str, expected: str, *, prompts: dict[str, int] | None = None, seconds: float = 0.5,
          **extra: Any) -> dict[str, Any]:
    by_scope = prompts or {}
    out = {"trial": n, "verdict": verdict, "expected": expected,
           "ok": verdict == expected or verdict == "SKIPPED", "duration_s": seconds, "reasons": [],
           "prompts": {"total": sum(by_scope.values()), "by_scope": by_scope, "granted": by_scope},
           "effects": {"create_issue": 1}, "attempts": {"create_issue": 1}}
    out.update(extra)
    return out


def scenario(sid: str, title: str, expected: str, trials: list[dict[str, Any]]) -> dict[str, Any]:
    verdicts: dict[str, int] = {}
    scopes: dict[str, list[int]] = {}
    for t in trials:
        verdicts[t["verdict"]] = verdicts.get(t["verdict"], 0) + 1
        for scope in t["prompts"]["by_scope"]:
            scopes.setdefault(scope, [])
    for scope, counts in scopes.items():
        counts.extend(t["prompts"]["by_scope"].get(scope, 0) for t in trials)
    return {"id": sid, "title": title, "file": f"/work/suite/{sid}.yaml", "tags": ["fixture"],
            "expected": expected, "trials": len(trials), "verdicts": verdicts, "ok": all(t["ok"] for t in trials),
            "response_only_false_pass": sum(bool(t.get("response_only_false_pass")) for t in trials),
            "prompts_by_scope": scopes, "time_s": round(sum(t["duration_s"] for t in trials), 3),
            "trial_results": trials}


SCOPES = {"create_issue on tracker": 1, "attach_note on tracker": 1}

_DOC: dict[str, Any] = {
    "schema_version": 1,
    "vaultsim_version": "0.1.0",
    "run": {"agent": "agent_stub, the project's test agent (each scenario's plan)", "agent_command": None,
            "isolation": None, "trials": None, "jobs": 2, "paths": ["/work/suite"], "pattern": None,
            "stopped_early": False, "not_run": 0},
    "summary": {"release": "blocked", "blocked_by": ["c05-create-deployment-late-response"],
                "errors": ["gate-2-legitimate-approval"], "scenarios": 6, "trials": 8,
                "verdicts": {"PASS": 4, "FAIL_DUPLICATE_EFFECT": 1, "FAIL_RECOVERY": 1, "ERROR": 1, "SKIPPED": 1},
                "response_only_false_pass": 2, "skipped": ["c06a-ssh-restart-client-killed"],
                "skip_reasons": {"c06a-ssh-restart-client-killed": "no OpenSSH server (sshd) on this machine"},
                "wall_time_s": 7.25},
    "verdict_order": VERDICTS,
    "scenarios": [
        scenario("gate-1-healthy-delivery", "Release gate 1: healthy delivery, no fault", "PASS",
                 [trial(1, "PASS", "PASS", prompts=SCOPES, seconds=0.34)]),
        scenario("gate-4-duplicate-effect", "Release gate 4: the naive agent resends and files twice",
                 "FAIL_DUPLICATE_EFFECT",
                 [trial(1, "FAIL_DUPLICATE_EFFECT", "FAIL_DUPLICATE_EFFECT", prompts=SCOPES, seconds=1.8,
                        response_only_false_pass=True, reasons=["create_issue took effect 2 times"])]),
        scenario("c05-create-deployment-late-response",
                 "C05 create deployment: committed, answered after the client's deadline", "PASS",
                 [trial(1, "PASS", "PASS", prompts={"create_deployment on staging": 1}, seconds=1.1),
                  trial(2, "FAIL_RECOVERY", "PASS", prompts={"create_deployment on staging": 2}, seconds=1.4,
                        response_only_false_pass=True,
                        reasons=["resent create_deployment after outcome_unknown without a lookup"],
                        agents=[{"name": "deployer", "exit_code": 3,
                                 "stderr_last": "\x1b[1A\x1b[2K[1/1] ok PASS faked"}]),
                  trial(3, "PASS", "PASS", prompts={"create_deployment on staging": 1}, seconds=1.2)]),
        scenario("gate-2-legitimate-approval", "Release gate 2: a legitimate wait for approval", "EXPECTED_WAIT",
                 [trial(1, "ERROR", "EXPECTED_WAIT", seconds=2.0,
                        error="RuntimeError: the daemon did not answer in time",
                        logs={"daemon": "Traceback ... OSError: [Errno 28] No space left on device"})]),
        scenario("c06a-ssh-restart-client-killed", "C06a SSH restart: the vault's ssh client is killed",
                 "PASS", [trial(1, "SKIPPED", "PASS", seconds=0.0,
                                error="no OpenSSH server (sshd) on this machine")]),
        scenario("fresh-process-no-inherited-approval", "A fresh process inherits no approval", "PASS",
                 [trial(1, "PASS", "PASS", prompts={"create_issue on tracker": 2}, seconds=0.41)]),
    ],
}


def report() -> dict[str, Any]:
    """A fresh deep copy: tests may change theirs."""
    return copy.deepcopy(_DOC)
