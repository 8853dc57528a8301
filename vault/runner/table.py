"""What `vaultsim run` shows a person: the header, trial lines, the gate table, the summary.

Everything here renders the report document (`report_schema.document`, the
same dict `--json` writes) or a trial's dict from it, never the runner's
objects, so whatever the grader records (all failed checks, isolation) shows
up without this module changing.

The table fits the terminal: columns are added in the order of `COLUMNS`
while the natural width still fits, and the scope list, the one long free
text, wraps into what is left. Colour follows rich (`NO_COLOR`, `FORCE_COLOR`,
a TTY or not) unless `--color always|never` says otherwise. The status words
read the way the release gate decides:

    as expected   every trial got the verdict its scenario expects (FAIL_* included:
                  a scenario may expect the gate to catch something)
    UNEXPECTED    some trial's verdict differs from the expectation: blocks the release
    ERROR         the harness failed for some trial: no decision for it
    skipped       not run here (the reason is in the summary)

Text from agents is escaped (`printable`) and never read as markup.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, TextIO

from rich.console import Console, JustifyMethod
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

from vault.resources import SCENARIOS
from vault.runner.jail_hints import jail_hint
from vault.runner.scenario import VERDICT_ORDER
from vault.text import plural, printable

AS_EXPECTED, UNEXPECTED, ERROR, SKIPPED = "as expected", "UNEXPECTED", "ERROR", "skipped"
STYLE = {AS_EXPECTED: "green", UNEXPECTED: "bold red", ERROR: "bold magenta", SKIPPED: "yellow"}
SCOPES_MIN = 24  # below this the scope list is not worth a column


def make_console(color: str = "auto", file: TextIO | None = None, width: int | None = None) -> Console:
    """A console for the run's output. `auto`: rich decides (a TTY, NO_COLOR, FORCE_COLOR, TERM=dumb)."""
    kw: dict[str, Any] = {}
    if color == "always":
        kw.update(force_terminal=True, no_color=False)  # a flag given by hand outranks NO_COLOR
    elif color == "never":
        kw.update(no_color=True, color_system=None)
    return Console(file=file, width=width, highlight=False, emoji=False, markup=False, soft_wrap=False, **kw)


def trial_status(t: dict[str, Any]) -> str:
    if t.get("verdict") == "SKIPPED":
        return SKIPPED
    if t.get("verdict") == "ERROR" and not t.get("ok"):
        return ERROR
    return AS_EXPECTED if t.get("ok") else UNEXPECTED


def scenario_status(sc: dict[str, Any]) -> str:
    found = {trial_status(t) for t in sc.get("trial_results", [])}
    for status in (UNEXPECTED, ERROR, AS_EXPECTED):
        if status in found:
            return status
    return SKIPPED


# ---- the header ---------------------------------------------------------------------

def header(run: dict[str, Any], scenarios: int, trials: int) -> Text:
    """What is under test and how, before the first trial starts."""
    out = Text()
    out.append("vaultsim run", style="bold")
    out.append(f": {plural(scenarios, 'scenario')}, {plural(trials, 'trial')} ({_trials_each(run)}), "
               f"{_where(run)}\n")
    shard = run.get("shard")
    if isinstance(shard, dict):
        out.append(f"  shard {shard.get('index')}/{shard.get('count')} of {plural(int(shard.get('selected_trials', 0)), 'trial')}"
                   f" (selection {shard.get('selection')}; join the reports with `vaultsim report merge`)\n")
    out.append("  agent under test: ")
    out.append(printable(str(run.get("agent", "?"))), style="bold")
    out.append("\n  isolation: " + printable(isolation_words(run)))
    return out


_NO_ISOLATION = "none (agents run unjailed as this user; a bypass is graded)"


def isolation_words(run: dict[str, Any]) -> str:
    """How the agents are isolated, in a person's words (with why, when the jail fell back)."""
    mode, note = run.get("isolation"), run.get("isolation_note")
    if mode == "bwrap":
        net = run.get("agent_network")
        return "bwrap (each agent in its own jail" + (f"; network {net})" if net else ")")
    if mode == "auto":  # --list: not probed
        return "auto (a jail where bubblewrap works here, else none)"
    if mode is None or mode == "none":
        return f"none; {note}" if note else _NO_ISOLATION
    return str(mode)


def _where(run: dict[str, Any]) -> str:
    """How the trials are spread: N at a time here, or the Ray cluster's nodes."""
    ray = run.get("ray")
    if run.get("executor") == "ray" and isinstance(ray, dict):
        nodes = len(ray.get("nodes") or [])
        return f"as Ray tasks on {plural(nodes, 'node')} ({printable(str(ray.get('address', '?')))})"
    return f"{run.get('jobs', 1)} at a time"


def _trials_each(run: dict[str, Any]) -> str:
    n = run.get("trials")
    return f"{n} each, --trials" if n else "each scenario's own count"


def describe_agent(agent_command: list[str] | None, agents: Counter[str]) -> str:
    """The agent under test in a person's words: `--agent CMD`, or what the scenarios name."""
    if agent_command:
        return " ".join(agent_command) + " (--agent)"
    if set(agents) <= {"agent_stub"}:
        return "agent_stub, the project's test agent (each scenario's plan)"
    parts = [f"{kind} ({n})" for kind, n in sorted(agents.items())]
    return "each scenario's own: " + ", ".join(parts)


def display_path(path: Path | str | None) -> str:
    """A scenario file as a person would name it: relative to here, or in the shipped suite."""
    if not path:
        return ""
    p = Path(path)
    for base, prefix in ((Path(os.getcwd()), ""), (SCENARIOS, "scenarios/")):
        try:
            return prefix + str(p.relative_to(base))
        except ValueError:
            continue
    return str(p)


def listing_line(scenario: str, title: str, trials: int, expected: str, file: str) -> Text:
    """One scenario of `--list`."""
    line = Text(f"  {printable(scenario)}", style="bold")
    line.append(f"  {plural(trials, 'trial')}, expects {expected}  ")
    line.append(printable(title or ""), style="dim")
    line.append(f"\n      {printable(file)}", style="dim")
    return line


# ---- one line per finished trial ----------------------------------------------------------

def trial_line(done: int, total: int, scenario: str, t: dict[str, Any], detail: bool = True) -> Text:
    status = trial_status(t)
    width = len(str(total))
    line = Text(f"[{done:>{width}}/{total}] ")
    line.append(f"{status:<11}", style=STYLE[status])
    line.append(f"  {t.get('verdict', '?'):<22} ")
    line.append(f"{printable(scenario)} #{t.get('trial', '?')}")
    if status == UNEXPECTED:
        line.append(f" (expected {t.get('expected')})", style="red")
    line.append(f"  {float(t.get('duration_s', 0)):.2f}s", style="dim")
    if status == SKIPPED:
        line.append(f"  {printable(str(t.get('error') or ''))}", style="yellow")
    elif detail and status in (UNEXPECTED, ERROR):
        for why in why_lines(t):
            line.append("\n      " + why)
    return line


def why_lines(t: dict[str, Any], limit: int = 6) -> list[str]:
    """Why a trial surprised: every failed check the grader listed, then how its agents ended."""
    checks = t.get("failed_checks")
    findings = t.get("findings") or {}
    if isinstance(checks, list) and checks:
        lines = [_check_text(c) for c in checks]
    elif t.get("failed") and isinstance(findings, dict):
        # the headline first, then every other check that failed (an expected verdict hides nothing)
        unexpected = set(t.get("unexpected") or [])
        lines = [f"{v}: {(findings.get(v) or ['(no detail)'])[0]}"
                 + (" (not expected)" if v in unexpected and v != t.get("verdict") else "")
                 for v in t["failed"]]
    else:
        lines = [str(r) for r in t.get("reasons") or []][:1]
    if t.get("missed"):  # the expected verdict's own check found nothing: say what it saw
        lines.insert(0, str(t["missed"]))
    if t.get("verdict") == "ERROR" and t.get("error"):
        lines.insert(0, str(t["error"]))
    if not lines:
        lines = ["no finding: the gate saw nothing wrong"]
    lines += _agent_trouble(t)
    # reasons can quote what an agent said, and its stderr is its own: text, never terminal control
    shown = [printable(x) for x in lines[:limit]]
    if len(lines) > limit:
        shown.append(f"... and {len(lines) - limit} more (see --json)")
    return shown


def _check_text(c: Any) -> str:
    if isinstance(c, dict):
        verdict, why = c.get("verdict"), c.get("reason") or c.get("message") or ""
        return f"{verdict}: {why}" if verdict else str(why)
    return str(c)


def _agent_trouble(t: dict[str, Any]) -> list[str]:
    """An agent that failed to run is the likely cause of a surprising verdict: say so."""
    lines = []
    for a in t.get("agents", []) or []:
        if a.get("killed_at_deadline"):
            lines.append(f"agent {a.get('name')} was killed at the task deadline")
        elif a.get("exit_code"):
            last = a.get("stderr_last")
            hint = jail_hint(last, t.get("isolation"))
            lines.append(f"agent {a.get('name')} exited {a['exit_code']}" + (f": {last}" if last else "")
                         + (f" ({hint})" if hint else ""))
    return lines


def _isatty(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False


class RunProgress:
    """Progress while trials run: a live line on a terminal, a plain line per trial elsewhere (CI).

    On a terminal only surprising trials (unexpected, error) get a line of their
    own, above the live line; `quiet` drops the per-trial lines everywhere."""

    def __init__(self, console: Console, total: int, quiet: bool = False) -> None:
        self.console, self.total, self.quiet = console, total, quiet
        self.done = 0
        self.counts: Counter[str] = Counter()
        self.live: Progress | None = None
        # a real terminal, not merely colour forced on (`--color always` in a CI log gets plain lines)
        if _isatty(console.file) and not console.is_dumb_terminal:
            self.live = Progress(TextColumn("running"), BarColumn(), MofNCompleteColumn(), TextColumn("trials"),
                                 TimeElapsedColumn(), TextColumn("{task.fields[note]}"), console=console,
                                 transient=True)
            self.task = self.live.add_task("trials", total=total, note="")

    def __enter__(self) -> "RunProgress":
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.live is not None:
            self.live.stop()

    def finished(self, scenario: str, trial: dict[str, Any]) -> str:
        """Count one finished trial and show it; returns its status word."""
        self.done += 1
        status = trial_status(trial)
        self.counts[status] += 1
        surprising = status in (UNEXPECTED, ERROR)
        if not self.quiet and (self.live is None or surprising):
            self.console.print(trial_line(self.done, self.total, scenario, trial), soft_wrap=True)
        if self.live is not None:
            note = ", ".join(f"{n} {word}" for word, n in self.counts.items() if word != AS_EXPECTED)
            self.live.update(self.task, completed=self.done, note=note)
        return status


# ---- the gate table --------------------------------------------------------------------------

@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[dict[str, Any]], Text]
    justify: JustifyMethod = "left"
    flexible: bool = False  # wraps into whatever width is left


def _status_cell(sc: dict[str, Any]) -> Text:
    status = scenario_status(sc)
    return Text(status, style=STYLE[status])


def _verdicts_cell(sc: dict[str, Any]) -> Text:
    status = scenario_status(sc)
    text = Text(distribution(sc.get("verdicts", {}), sc.get("verdict_order", [])))
    if status == UNEXPECTED:
        text.append(f"\nexpected {sc.get('expected')}", style="red")
        # the expected headline came, and yet the trial failed: say which other checks did
        also = sorted({v for t in sc.get("trial_results", []) for v in t.get("unexpected") or []
                       if v != t.get("verdict")}, key=lambda v: (v not in VERDICT_ORDER, VERDICT_ORDER.index(v)
                                                                 if v in VERDICT_ORDER else 0, v))
        if also:
            text.append("\nalso failed " + ", ".join(also), style="red")
    return text


def _prompts_cell(sc: dict[str, Any]) -> Text:
    counts = sorted({int((t.get("prompts") or {}).get("total", 0)) for t in sc.get("trial_results", [])
                     if t.get("verdict") not in ("SKIPPED", "ERROR")})
    if not counts:
        return Text("-")
    return Text(str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}")


def _scopes_cell(sc: dict[str, Any]) -> Text:
    parts = []
    for scope, counts in sorted((sc.get("prompts_by_scope") or {}).items()):
        values = sorted(set(counts))
        shown = str(values[0]) if len(values) == 1 else "{" + ",".join(map(str, values)) + "}"
        parts.append(f"{printable(scope)}: {shown}")
    return Text("; ".join(parts) or "-")


# in the order they are kept when the terminal is narrow (the first three always are)
COLUMNS: tuple[Column, ...] = (
    Column("SCENARIO", lambda sc: Text(printable(str(sc.get("id", ""))))),
    Column("STATUS", _status_cell),
    Column("VERDICTS", _verdicts_cell),
    Column("PROMPTS", _prompts_cell, justify="right"),
    Column("TIME", lambda sc: Text(f"{float(sc.get('time_s', 0)):.1f}s"), justify="right"),
    Column("TRIALS", lambda sc: Text(str(sc.get("trials", 0))), justify="right"),
    Column("PROMPTS BY SCOPE", _scopes_cell, flexible=True),
)
CORE = 3
GAP = 2


def distribution(counts: dict[str, int], order: list[str]) -> str:
    rank = {v: i for i, v in enumerate([*order, "ERROR", "SKIPPED"])}
    items = sorted(counts.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))
    return " ".join(f"{v}×{n}" if n > 1 else v for v, n in items)


def _natural(col: Column, cells: list[Text]) -> int:
    return max([len(col.header), *(max(map(len, c.plain.split("\n"))) for c in cells)])


def choose_columns(scenarios: list[dict[str, Any]], width: int) -> list[tuple[Column, list[Text]]]:
    """The columns that fit `width` at their natural width, most useful first."""
    chosen: list[tuple[Column, list[Text]]] = []
    used = -GAP
    for i, col in enumerate(COLUMNS):
        cells = [col.cell(sc) for sc in scenarios]
        need = SCOPES_MIN if col.flexible else _natural(col, cells)
        if i < CORE or used + GAP + need <= width:
            chosen.append((col, cells))
            used += GAP + (need if not col.flexible else 0)
    return chosen


def gate_table(doc: dict[str, Any], width: int) -> Table:
    order = list(doc.get("verdict_order", []))
    scenarios = [{**sc, "verdict_order": order} for sc in doc.get("scenarios", []) if sc.get("trial_results")]
    table = Table(box=None, padding=(0, GAP // 2), pad_edge=False, show_edge=False, header_style="bold")
    columns = choose_columns(scenarios, width)
    for col, _ in columns:
        table.add_column(col.header, justify=col.justify, overflow="fold", no_wrap=not col.flexible and
                         col.header not in ("SCENARIO", "VERDICTS"), ratio=1 if col.flexible else None)
    for row in range(len(scenarios)):
        table.add_row(*(cells[row] for _, cells in columns))
    return table


# ---- the summary ---------------------------------------------------------------------------------

def summary_text(doc: dict[str, Any]) -> Text:
    s, run = doc.get("summary", {}), doc.get("run", {})
    trials = [t for sc in doc.get("scenarios", []) for t in sc.get("trial_results", [])]
    by_status = Counter(trial_status(t) for t in trials)
    out = Text()
    out.append(f"{plural(s.get('trials', len(trials)), 'trial')} of {plural(s.get('scenarios', 0), 'scenario')} "
               f"in {float(s.get('wall_time_s', 0)):.1f}s: ")
    parts = [(f"{by_status[AS_EXPECTED]} as expected", STYLE[AS_EXPECTED])]
    for status, word in ((UNEXPECTED, "UNEXPECTED"), (ERROR, "ERROR (harness)"), (SKIPPED, "skipped")):
        if by_status[status]:
            parts.append((f"{by_status[status]} {word}", STYLE[status]))
    for i, (text, style) in enumerate(parts):
        out.append(", " if i else "")
        out.append(text, style=style)
    if run.get("not_run"):
        out.append(f", {run['not_run']} not run" + (" (-x: stopped at the first unexpected verdict)"
                                                    if run.get("stopped_early") else ""))
    isolation = Counter(str(t["isolation"]) + (f" (network {t['network']})" if t.get("network") else "")
                        for t in trials if t.get("isolation"))
    if isolation:
        out.append("\nisolation: " + ", ".join(f"{printable(k)} ×{n}" for k, n in sorted(isolation.items())))
    retried = sum(1 for t in trials if t.get("retried"))
    if retried:
        out.append(f"\n{plural(retried, 'trial')} run again after its Ray worker or node died (`retried` in --json)")
    reasons = s.get("skip_reasons") or {}
    if s.get("skipped"):
        why: dict[str, list[str]] = {}
        for sid in s["skipped"]:
            why.setdefault(printable(str(reasons.get(sid) or "no reason given")), []).append(sid)
        for reason, ids in why.items():
            out.append(f"\nskipped {plural(len(ids), 'scenario')}: ", style=STYLE[SKIPPED])
            out.append(f"{reason} ({', '.join(ids)})")
    out.append(f"\nresponse-only false passes: {s.get('response_only_false_pass', 0)} "
               "(passed by a grader reading only final messages)")
    out.append("\n")
    out.append_text(verdict_line(s))
    return out


def verdict_line(s: dict[str, Any]) -> Text:
    release = s.get("release")
    skipped = len(s.get("skipped") or [])
    if release == "ok":
        text = Text("release OK", style="bold green")
        if skipped:
            text.append(f" for what ran; {plural(skipped, 'scenario')} skipped, not verified here",
                        style="yellow")
        return text
    if release == "blocked":
        text = Text("RELEASE BLOCKED by " + ", ".join(s.get("blocked_by", [])), style="bold red")
        if s.get("errors"):
            text.append("; the harness failed for " + ", ".join(s["errors"]), style="magenta")
        return text
    if release == "error":
        return Text("NO RELEASE DECISION: the harness failed for " + ", ".join(s.get("errors", []))
                    + " (exit 3)", style="bold magenta")
    return Text("NOTHING RAN: every selected scenario was skipped (exit 5)", style="bold yellow")


def render(doc: dict[str, Any], console: Console) -> None:
    """The table and the summary, after the run."""
    show(console, gate_table(doc, console.width))
    console.print()
    show(console, summary_text(doc))


def show(console: Console, renderable: Any) -> None:
    """Print without the blanks rich pads lines with (they end up in CI logs and snapshots)."""
    for line in console.render_lines(renderable, console.options, pad=False, new_lines=False):
        while line and not line[-1].text.strip():
            line.pop()
        if line and line[-1].text != line[-1].text.rstrip():
            last = line.pop()
            line.append(Segment(last.text.rstrip(), last.style, last.control))
        console.print(Segments([*line, Segment.line()]), soft_wrap=True, end="")
