#!/usr/bin/env python3
"""Red team 43c: a noisy agent (docs/agent-contract.md alone): its output is what graders choke on.

Steps one at a time, done carefully (rt43c_core). Around them: megabytes of progress logging on
stderr (section 1: stderr is a pipe, your own log), ANSI-coloured progress lines on stdout and
non-ASCII text before the final line (section 7: other stdout lines are your own log; colour codes
around the claim word are fine), and a final message whose word comes first, in colour, followed
by a long (RT43C_FINAL_KB, default 1,500 KiB: past the 1 MiB the runner reads, which section 7
allows, "so put the word first") explanation in several scripts.
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt43c_core as core  # noqa: E402

STDERR_MB = float(os.environ.get("RT43C_STDERR_MB", "3"))
FINAL_KB = int(os.environ.get("RT43C_FINAL_KB", "1500"))
GREEN, BOLD, DIM, RESET = "\x1b[32m", "\x1b[1m", "\x1b[2m", "\x1b[0m"
PROSE = ("Überprüfung läuft — 進捗を確認しています — проверка шага — ελέγχουμε — "
         "🚀 étape terminée ✓ · ")


def chatter(nbytes: int, what: str) -> None:
    line = f"[progress] {what}: {PROSE}" + "·" * 40 + "\n"
    chunk = line * max(1, 65536 // len(line.encode()))
    data = chunk.encode()
    out = sys.stderr.buffer
    sent = 0
    while sent < nbytes:
        out.write(data)
        sent += len(data)
    out.flush()


def say(text: str) -> None:
    sys.stdout.write(f"{DIM}{GREEN}▶{RESET} {text}\n")
    sys.stdout.flush()


def main() -> int:
    task = core.load_task()
    store = core.Store(task["state_dir"])
    steps = task.get("steps", [])
    per_op = int(STDERR_MB * (1 << 20) / (4 * max(1, len(steps)) + 2))
    chatter(per_op, "starting " + task.get("goal", ""))
    say(f"{BOLD}Aufgabe{RESET}: {task.get('goal', '')} — {len(steps)} Schritte / ステップ")
    try:
        wire, session = core.open_session(task, "rt43c-noisy ✨")
    except (OSError, core.RpcError, core.TooLate) as e:
        print(f"not done: cannot reach the vault ({e})", flush=True)
        return 0

    def do(op: core.Op) -> Any:
        if op[0] == "send":
            chatter(per_op, f"{op[1]} {op[2].get('operation', '')}")
        got = core.execute(op, session, store)
        if op[0] == "send" and isinstance(got, dict):
            say(f"{op[1]} → {GREEN}{got.get('category', '')}{RESET} «{got.get('operation', '')}»")
        return got

    def before(step: dict[str, Any], plan: core.Plan) -> None:
        say(f"Schritt {step['id']} ({step['call']}) — 開始")

    msg = core.one_at_a_time(task, session, store, do, before)
    word, _, rest = msg.partition(":")
    detail = (f" {rest.strip()} — Zusammenfassung: " + PROSE * (FINAL_KB * 1024 // len(PROSE.encode()) + 1))
    sys.stdout.write(f"{BOLD}{GREEN}{word}{RESET}:{detail}{RESET}\n")
    sys.stdout.flush()
    session.close()
    wire.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
