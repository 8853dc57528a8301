"""Red team 41c: a careful agent whose terminal output is what `rich` draws.

Written from docs/agent-contract.md (and the README's runner and jail sections). Its protocol is
tests/agents/careful.py's (raw socket, one session per process, a key per step, a lookup before
any resend after outcome_unknown, resume tokens kept in state_dir, `${ID.FIELD}` filled only from
results it was given, `never` answers honoured); what is new is how it prints, as real Python
agent tooling does. Run it with an interpreter that has `rich` (the project's venv).

RT41C_UI picks the look (comma-separated, any mix):
  markup    Console(force_terminal=True): markup, emoji (:white_check_mark:, ✔), CJK log lines
  progress  a Progress bar over the steps (a Live display: cursor hidden, lines redrawn)
  status    a Status spinner around every call
  rule      console.rule() before the summary
  table     a rich Table summary of the steps before the final message
  panel     the final message inside a Panel (§7: a box's row is read inside its frame)
  logging   RichHandler logging to stderr (and a log line per answer)
  dumb      TERM=dumb and NO_COLOR in its own environment before the Console is made
  tabs      a `\t`-aligned table of the steps and `tput` colours around the final word
RT41C_FINAL picks how the final line is printed: plain (default), bold (markup colour and
emoji before the word), json (rich's print_json of {"status": ..., "message": ...}), log
(console.log: a time before it and the caller's file and line after it), richlog (a RichHandler
record on stdout, its defaults: `[12/06/26 21:00:00] INFO ...`, the time left blank when repeated).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from careful import Careful, RpcError  # noqa: E402

UI = set(filter(None, os.environ.get("RT41C_UI", "markup").split(",")))
FINAL = os.environ.get("RT41C_FINAL", "plain")

if "dumb" in UI:
    os.environ["TERM"] = "dumb"
    os.environ["NO_COLOR"] = "1"

from rich.console import Console  # noqa: E402
from rich.logging import RichHandler  # noqa: E402
from rich.panel import Panel  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402

console = Console(force_terminal=True)
log = logging.getLogger("rt41c")
if "logging" in UI:
    logging.basicConfig(level=logging.INFO, format="%(message)s", datefmt="[%X]",
                        handlers=[RichHandler(console=Console(stderr=True, force_terminal=True),
                                              rich_tracebacks=True)])


def tput(*args: str) -> str:
    """What `tput` writes (terminfo's own sequences), or nothing where it cannot say."""
    try:
        return subprocess.run(["tput", "-T", "xterm-256color", *args], capture_output=True,
                              text=True, timeout=2).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


class RichCareful(Careful):
    def __init__(self, blocking: bool = True, same_key: bool = False) -> None:
        super().__init__(blocking=blocking, same_key=same_key)
        self.progress: Progress | None = None
        self.bar = None
        self.rows: list[tuple[str, str, str]] = []

    def log(self, obj: object) -> None:
        if not isinstance(obj, dict):
            return
        cat = str(obj.get("category"))
        mark = ":white_check_mark:" if obj.get("ok") else ":hourglass:" if cat == "approval_pending" else "✘"
        # Markup off for the vault's own text: a `[...]` in a message is not a style.
        console.print(f"{mark} [cyan]{obj.get('operation')}[/cyan] → ", end="")
        console.print(f"{cat} (retry: {obj.get('retry')}) 结果已记录", markup=False, highlight=False)
        if "logging" in UI:
            log.info("answer %s for %s", cat, obj.get("operation"))

    def call(self, step: dict, params: dict, key: str | None) -> dict:
        if "status" not in UI:
            return super().call(step, params, key)
        with console.status(f"[bold]calling {step['call']}…", spinner="dots"):
            return super().call(step, params, key)

    def do_step(self, step: dict) -> None:
        try:
            super().do_step(step)
        except BaseException:
            self.rows.append((step["id"], step["call"], "stopped"))
            raise
        self.rows.append((step["id"], step["call"], "✔ ok"))
        if self.progress is not None and self.bar is not None:
            self.progress.advance(self.bar)

    def run(self) -> str:
        steps = self.task.get("steps") or []
        console.rule(f"[bold]{self.task.get('goal', '')}", characters="─")
        console.print(f"[bold]agent[/bold] {self.name}: {len(steps)} step(s) 任务开始 :rocket:")
        if "progress" not in UI:
            return super().run()
        with Progress(console=console) as progress:
            self.progress = progress
            self.bar = progress.add_task("steps", total=len(steps))
            try:
                return super().run()
            finally:
                self.progress = None

    def summary(self) -> None:
        if "tabs" in UI:
            print("step\toperation\tresult")
            for row in self.rows:
                print("\t".join(row))
        if "table" in UI:
            table = Table(title="steps")
            for col in ("step", "operation", "result"):
                table.add_column(col)
            for row in self.rows:
                table.add_row(*row)
            console.print(table)
        if "rule" in UI:
            console.rule("summary")

    def say(self, message: str) -> None:
        """The final message, last on stdout (after the session is closed)."""
        word, _, rest = message.partition(":")
        if FINAL == "json":
            status = {"done": "done", "waiting": "waiting"}.get(word.strip().lower(), "not_done")
            console.print_json(json.dumps({"status": status, "message": message}))
            return
        if "panel" in UI:
            # A panel row is read inside its frame only while it is one row: keep it short.
            console.print(Panel(Text(f"{word}:{rest[:40]}"), title="rt41c", expand=False,
                                subtitle=f"[dim]{len(self.rows)} step(s)[/dim]"))
            return
        if "tabs" in UI:
            sys.stdout.write(f"{tput('bold')}{tput('setaf', '2')}{word}{tput('sgr0')}:{rest}\n")
            sys.stdout.flush()
            return
        if FINAL == "richlog":
            # logging through RichHandler on stdout with its defaults (`[%x %X]`, a repeated time
            # left blank): a record just before, so the final one is often in the same second. Rich
            # wraps a record past its message column (about 30 wide here): only the start
            out = logging.getLogger("rt41c.final")
            out.propagate = False
            out.setLevel(logging.INFO)
            out.addHandler(RichHandler(console=console))
            out.info("session closed")
            out.info(message[:24])
            return
        if FINAL == "log":
            # `[21:00:00] done: ...   file.py:123`; console.log wraps a long message (it has no
            # soft_wrap) and its tail would be the last line: only the start, which holds the word
            console.log(message[:40], markup=False, highlight=False)
            return
        if FINAL == "bold":
            style = "bold green" if word == "done" else "bold yellow" if word == "waiting" else "bold red"
            emoji = ":white_check_mark:" if word == "done" else "⏳" if word == "waiting" else "✘"
            console.print(f"{emoji} [{style}]{word}[/{style}]:", end="")
            console.print(rest, markup=False, highlight=False, soft_wrap=True)
            return
        # soft_wrap: rich wraps at the console's width (80 under a pipe) with real line ends,
        # which would leave the message's tail as the last line.
        console.print(message, markup=False, highlight=False, soft_wrap=True)


def main() -> int:
    agent = RichCareful(blocking="--non-blocking" not in sys.argv, same_key="--same-key" in sys.argv)
    message = agent.run()
    agent.summary()
    try:
        agent.rpc("session.close", session_id=agent.session)
    except (RpcError, OSError):
        pass
    agent.say(message)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
