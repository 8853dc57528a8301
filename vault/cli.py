"""`vaultsim` command line: a thin router to one module per command.

Each command module exposes `configure(parser)` and `run(args) -> int` (or
`configure_X`/`run_X` when one module serves several commands, "module:X"); only
the module for the command given is imported, so `vaultsim status` never
pays for Textual. Exit codes: 0 ok, 1 the command's negative answer, 2 bad input.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import BadInput, VaultError

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("vault.runner.cli", "run scenarios in fresh processes and decide the release"),
    "daemon": ("vault.daemon_cli:daemon", "start the vault daemon"),
    "stop": ("vault.daemon_cli:stop", "stop the vault daemon"),
    "status": ("vault.daemon_cli:status", "show whether a daemon serves this home"),
    "lock": ("vault.approver_cli:lock", "lock the vault (through the approver channel)"),
    "unlock": ("vault.approver_cli:unlock", "unlock the vault (through the approver channel)"),
    "secret": ("vault.store_cli", "set, list or remove credentials (values never printed)"),
    "approve": ("vault.scripted_approver", "scripted approver: answer prompts from rules"),
    "tui": ("tui.cli", "the Textual approver"),
    "demo": ("tui.demo", "one-command interactive demo"),
    "audit": ("vault.audit.cli", "verify (offline) or show (with the key) the audit log"),
    "stats": ("vault.approver_cli:stats", "prompt counts and scopes"),
    "remote": ("vault.remote.cli", "the fault-injecting fake remote, standalone"),
    "diag": ("vault.diagnostics_cli", "show a protected diagnostic, for an operator"),
    "schema": ("vault.schema_cli", "print the JSON Schema of the Result model"),
    "mcp": ("vault.mcp.cli", "MCP server (stdio, or HTTP on loopback) forwarding to the daemon"),
}


def _top_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vaultsim",
        description="Approval and credential vault simulator for testing AI agents.",
        epilog="\n".join(f"  {name:<8} {desc}" for name, (_, desc) in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("command", choices=sorted(COMMANDS), metavar="COMMAND")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        _top_parser().parse_args(argv[:1] or ["--help"])
        return 2
    name = argv[0]
    target, _, suffix = COMMANDS[name][0].partition(":")
    module = importlib.import_module(target)
    configure = getattr(module, f"configure_{suffix}" if suffix else "configure")
    run = getattr(module, f"run_{suffix}" if suffix else "run")
    parser = argparse.ArgumentParser(prog=f"vaultsim {name}", description=COMMANDS[name][1])
    configure(parser)
    args = parser.parse_args(argv[1:])
    try:
        return int(run(args) or 0)
    except BadInput as exc:
        print(f"vaultsim {name}: {exc.message}", file=sys.stderr)
        return 2
    except VaultError as exc:
        print(f"vaultsim {name}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def add_home_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", help="vault home (default: $VAULTSIM_HOME or the user data dir)")


if __name__ == "__main__":
    sys.exit(main())
