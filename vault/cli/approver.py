"""`vaultsim lock`, `vaultsim unlock`, `vaultsim stats`: one-shot approver-channel commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from vault.cli.main import add_home_arg
from vault.client import ApproverClient
from vault.errors import HomeError
from vault.home import VaultHome
from vault.proc_guard import make_undumpable
from vault.text import plural, printable


def _request(args: argparse.Namespace, method: str, **params: Any) -> Any:
    make_undumpable()  # it reads the approver token
    home = VaultHome.resolve(args.home).check()  # a file or an open directory: exit 2, said plainly
    from vault.cli.daemon_probe import held_by
    held = held_by(home, wait_s=0)
    if held is not None and held.state == "stopped":  # it would hold us for the client's whole timeout
        raise HomeError(f"cannot {method}: {held.why(str(home.root))}")
    with ApproverClient.for_home(home, name=f"vaultsim-{method}") as c:
        # stats comes in pages: read them all
        return c.all_pages(method, **params) if method == "stats" else c.request(method, **params)


def configure_lock(p: argparse.ArgumentParser) -> None:
    add_home_arg(p)
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")


def run_lock(args: argparse.Namespace) -> int:
    out = _request(args, "lock")
    if args.json:
        print(json.dumps({"locked": True, "pending_denied": out["pending_denied"],
                          "grants_ended": out["grants_ended"]}, sort_keys=True))
    else:
        print(f"vault locked ({plural(out['pending_denied'], 'pending approval')} denied, "
              f"{plural(out['grants_ended'], 'grant')} ended)")
    if out.get("note"):  # locked all the same; the log could not record it (a full disk)
        print(f"vaultsim lock: {printable(str(out['note']))}", file=sys.stderr)
    return 0


configure_unlock = configure_lock


def run_unlock(args: argparse.Namespace) -> int:
    _request(args, "unlock")
    print(json.dumps({"locked": False}) if args.json else "vault unlocked")
    return 0


def _seconds(text: str) -> float:
    """A duration in seconds, 0 or more (argparse's type: a bad one is a usage error, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 or more seconds")
    return value


def configure_stats(p: argparse.ArgumentParser) -> None:
    add_home_arg(p)
    p.add_argument("--run", dest="run_id", help="only this run id")
    p.add_argument("--rubber-stamp-s", type=_seconds, default=1.0, metavar="S",
                   help="an approval within S seconds of being shown is a rubber-stamp (default 1)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def run_stats(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"run_id": args.run_id} if args.run_id else {}
    if args.rubber_stamp_s != 1.0:
        params["rubber_stamp_s"] = args.rubber_stamp_s
    report = _request(args, "stats", **params)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    if args.run_id and not report.get("runs"):
        # "no prompts yet" of a vault that asked in other runs: a mistyped run id read as 0 prompts
        others = sorted(_request(args, "stats").get("runs", {}))
        print(f"no prompts in run '{printable(args.run_id)}' (runs with prompts: "
              f"{', '.join(printable(r) for r in others) if others else 'none yet'})")
        return 0
    print(format_stats(report))
    return 0


def format_stats(report: dict[str, Any]) -> str:
    lines = []
    for run_id, c in sorted(report.get("runs", {}).items()):
        lines.append(f"run {printable(run_id)}: {plural(c['prompts'], 'prompt')} "
                     f"({c['read_prompts']} for reads, {plural(c['repeated_scope_prompts'], 'repeated scope')}, "
                     f"{plural(c['destructive_session_grants'], 'destructive session grant')}, "
                     f"{c['unroutable']} unroutable)")
        for scope, n in sorted(c["scopes_asked"].items()):
            granted = c["scopes_granted"].get(scope, 0)
            lines.append(f"  {n:>3} asked  {granted:>3} granted  {printable(scope)}")
        if c["decisions"]:
            lines.append("  decisions: " + ", ".join(f"{k} {v}" for k, v in sorted(c["decisions"].items())))
        if c.get("fatigue"):  # an older daemon sends none
            lines.extend(format_fatigue(c["fatigue"]))
    return "\n".join(lines) or "no prompts yet"


def _s(value: Any) -> str:
    return "-" if value is None else f"{value:g} s"


def format_fatigue(f: dict[str, Any], indent: str = "  ") -> list[str]:
    """The fatigue figures (vault.gate.fatigue) in a few lines: the run's, then each approver's."""
    def line(fig: dict[str, Any]) -> str:
        pm, lat = fig.get("per_minute") or {}, fig.get("latency_s") or {}
        return (f"{pm.get('peak', 0)}/min peak, {pm.get('mean', 0):g}/min mean; decision latency "
                f"p50 {_s(lat.get('p50'))}, p90 {_s(lat.get('p90'))}; {plural(fig.get('rubber_stamps', 0), 'rubber-stamp')}, "
                f"{fig.get('detail_not_viewed', 0)} without detail, longest approval streak "
                f"{fig.get('longest_approval_streak', 0)}, {fig.get('reasked_after_denial', 0)} re-asked after a denial")
    out = [f"{indent}fatigue: {line(f)}",
           f"{indent}  {plural(f.get('read_prompts', 0), 'prompt')} on reads, "
           f"{plural(f.get('session_grants_destructive', 0), 'session grant')} covering a destructive class (rubber-stamp: under {f.get('rubber_stamp_s', 1.0):g} s "
           "or no detail viewed)"]
    for name, fig in sorted((f.get("by_approver") or {}).items()):
        out.append(f"{indent}  approver {printable(name)}: {fig.get('prompts', 0)} decided; {line(fig)}")
    return out
