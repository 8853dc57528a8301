"""`vaultsim lock`, `vaultsim unlock`, `vaultsim stats`: one-shot approver-channel commands."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .cli import add_home_arg
from .client import ApproverClient
from .home import VaultHome
from .text import printable


def _request(args: argparse.Namespace, method: str, **params: Any) -> Any:
    home = VaultHome.resolve(args.home)
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
        print(f"vault locked ({out['pending_denied']} pending approvals denied, "
              f"{out['grants_ended']} grants ended)")
    return 0


configure_unlock = configure_lock


def run_unlock(args: argparse.Namespace) -> int:
    _request(args, "unlock")
    print(json.dumps({"locked": False}) if args.json else "vault unlocked")
    return 0


def configure_stats(p: argparse.ArgumentParser) -> None:
    add_home_arg(p)
    p.add_argument("--run", dest="run_id", help="only this run id")
    p.add_argument("--json", action="store_true")


def run_stats(args: argparse.Namespace) -> int:
    params = {"run_id": args.run_id} if args.run_id else {}
    report = _request(args, "stats", **params)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    print(format_stats(report))
    return 0


def format_stats(report: dict[str, Any]) -> str:
    lines = []
    for run_id, c in sorted(report.get("runs", {}).items()):
        lines.append(f"run {printable(run_id)}: {c['prompts']} prompts "
                     f"({c['read_prompts']} for reads, {c['repeated_scope_prompts']} repeated scopes, "
                     f"{c['destructive_session_grants']} destructive session grants, "
                     f"{c['unroutable']} unroutable)")
        for scope, n in sorted(c["scopes_asked"].items()):
            granted = c["scopes_granted"].get(scope, 0)
            lines.append(f"  {n:>3} asked  {granted:>3} granted  {printable(scope)}")
        if c["decisions"]:
            lines.append("  decisions: " + ", ".join(f"{k} {v}" for k, v in sorted(c["decisions"].items())))
    return "\n".join(lines) or "no prompts yet"
