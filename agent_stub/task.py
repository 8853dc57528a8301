"""The task an agent is given (`$VAULTSIM_TASK`, a JSON file) and its clock.

The runner writes one per agent process (docs/agent-contract.md, built by
vault.runner.contract): the agent name, the steps, the operations the agent may
use, an absolute deadline (seconds since the epoch), a directory where the
agent may persist what must survive a restart. Under `agent_stub` it also
names this stub's plan file, which is the stub's own and not the contract.
agent_stub uses the deadline to keep a reserve for verification.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Task:
    goal: str = ""
    operations: list[str] = field(default_factory=list)
    deadline: float | None = None  # seconds since the epoch
    state_dir: str | None = None
    plan: str | None = None
    agent: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> "Task":
        path = os.environ.get("VAULTSIM_TASK")
        if not path:
            return cls()
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("task is not a JSON object")
        deadline = data.get("deadline")
        given = data.get("agent_stub")
        stub: dict[str, Any] = given if isinstance(given, dict) else {}
        return cls(goal=str(data.get("goal", "")), operations=list(data.get("operations") or []),
                   deadline=float(deadline) if isinstance(deadline, (int, float)) else None,
                   state_dir=data.get("state_dir"), plan=stub.get("plan") or data.get("plan"),
                   agent=data.get("agent") if isinstance(data.get("agent"), str) else None, raw=data)

    def time_left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.time()
