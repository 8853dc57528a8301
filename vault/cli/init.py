"""`vaultsim init [DIR]`: a starter suite to edit, copied from what vaultsim ships.

Two scenarios (vault/starter: the healthy path, and a lost answer the agent
must reconcile), the catalog and default policy they use, one approver
script and the agents' plans, laid out as the shipped suite is, so that
`vaultsim run DIR` passes at once and every file is the user's to change.
An existing file is never overwritten without `--force`: nothing is written
unless everything can be. Each file is written whole (vault.atomic), and if one
cannot be (a full disk), what this run created is removed again: no empty or
half file, no half suite that a retry without `--force` would refuse.
"""

from __future__ import annotations

import argparse
import contextlib
from importlib.resources import files
from pathlib import Path

from vault.atomic import write_private
from vault.cli.main import path_arg
from vault.errors import BadInput
from vault.resources import shipped

# destination -> source (a shipped file, or a starter scenario)
STARTER: dict[str, Path] = {
    "catalog.yaml": shipped("catalog.yaml"),
    "policies/default.yaml": shipped("policies", "default.yaml"),
    "approvers/allow-session.yaml": shipped("approvers", "allow-session.yaml"),
    "plans/file-and-triage.yaml": shipped("plans", "file-and-triage.yaml"),
    "plans/deploy.yaml": shipped("plans", "deploy.yaml"),
    "healthy-delivery.yaml": Path(str(files("vault") / "starter" / "healthy-delivery.yaml")),
    "deploy-answer-lost.yaml": Path(str(files("vault") / "starter" / "deploy-answer-lost.yaml")),
}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", nargs="?", default=".", metavar="DIR", type=path_arg, help="where to write (default: here)")
    p.add_argument("--force", action="store_true", help="overwrite files that are already there")


def run(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if root.exists() and not root.is_dir():
        raise BadInput(f"{root} exists and is not a directory")
    taken = [name for name in STARTER if (root / name).exists()]
    if taken and not args.force:
        raise BadInput(f"{root} already has {', '.join(taken)}; nothing written (--force overwrites)")
    created: list[Path] = []  # what this run made, newest last: removed again if a write fails
    try:
        for name, source in STARTER.items():
            dest = root / name
            _make_dirs(dest.parent, created)
            existed = dest.exists()
            write_private(dest, source.read_bytes(), mode=0o644)
            if not existed:
                created.append(dest)
    except OSError as exc:
        for path in reversed(created):
            with contextlib.suppress(OSError):
                path.rmdir() if path.is_dir() else path.unlink()
        raise BadInput(f"cannot write the starter suite in {root}: {exc.strerror or exc}; "
                       "the files it had created were removed") from None
    shown = str(root) if str(root) != "." else "."
    print(f"vaultsim init: wrote a starter suite to {shown}/")
    for name in STARTER:
        print(f"  {name}")
    print("next:")
    print(f"  vaultsim run {shown}          # both scenarios pass: exit 0")
    print(f"  vaultsim run {shown} --agent 'python my_agent.py'   # put your own agent under test")
    print("  vaultsim schema scenario      # every field a scenario may have")
    return 0


def _make_dirs(directory: Path, created: list[Path]) -> None:
    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    for d in reversed(missing):
        d.mkdir()
        created.append(d)
