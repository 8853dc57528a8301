"""Decision receipts: what a restarted agent must remember to continue, not redo.

A pending approval is only useful if whoever continues the work can collect
it: the receipt keeps the request id, correlation id, owner, deadline and
resume token of every wait, and the result data of every finished step, in one
JSON file (0600, replaced atomically) in the task's state directory. A fresh
process of the same agent reads it, resumes the waits and skips finished
steps. A receipt names its step by position, operation and parameters, so a
different task that happens to share the state directory never matches it.
Without a state directory the receipts live in memory only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

FILE_NAME = "receipts.json"


def step_id(index: int, call: str, params: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{index}:{call}:{digest}"


class Receipts:
    def __init__(self, state_dir: str | None) -> None:
        self.path = Path(state_dir) / FILE_NAME if state_dir else None
        self.pending: dict[str, dict[str, Any]] = {}
        self.done: dict[str, dict[str, Any]] = {}
        if self.path is not None and self.path.exists():
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self.pending = dict(data.get("pending") or {})
            self.done = dict(data.get("done") or {})

    def wait(self, step: str, receipt: dict[str, Any]) -> None:
        self.pending[step] = receipt
        self._save()

    def finished(self, step: str, data: dict[str, Any]) -> None:
        self.pending.pop(step, None)
        self.done[step] = data
        self._save()

    def dropped(self, step: str) -> None:
        if self.pending.pop(step, None) is not None:
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"pending": self.pending, "done": self.done}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
