"""`vaultsim` command line: a thin router to one module per command.

Each command module exposes `configure(parser)` and `run(args) -> int` (or
`configure_X`/`run_X` when one module serves several commands, "module:X"); only
the module for the command given is imported, so `vaultsim status` never
pays for Textual. The exit codes are pytest's, which CI users already know
(`EXIT_CODES`, printed by `vaultsim --help`). Shell completion is argcomplete's:
only while a shell asks for completions (`_ARGCOMPLETE` set) is every command's
parser built. A stdout that cannot take the output (a reader that left, a full
disk) ends the command without a traceback (vault.cli.stdout). With `--json`,
an error is also a JSON object on stdout, `{"error": ..., "exit_code": N}`
(the human line still goes to stderr), so a script parsing stdout always
gets a document; Ctrl-C is exit 130 with one line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from vault import __version__
from vault.cli import stdout
from vault.errors import BadInput, VaultError

# pytest's numbers: 0 ok, 1 tests failed, 2 usage, 3 internal error, 5 nothing collected
EXIT_CODES = """\
exit codes (every command; the same as pytest's):
  0    done; `run`: release OK (skipped scenarios are listed, not failed);
       `status`: a daemon serves the home and it is unlocked
  1    the command's negative answer: `run`: release blocked; `audit verify`:
       not intact; `status`: no daemon running; or it could not be done
       (no daemon to ask, a refusal)
  2    bad input or usage: a file, a field, an option; `status`: locked
  3    internal or infrastructure error: a trial's harness failed
       (`run`: no release decision), or a bug in vaultsim
  5    nothing selected: `run` found no scenario to run
  130  interrupted (Ctrl-C); everything started was stopped
  143  `tui`, `demo`: stopped by SIGTERM (129: by SIGHUP), everything started
       stopped; `daemon`, `remote`, `mcp`, `approve` exit 0 on either"""


@dataclass(frozen=True)
class Command:
    target: str  # "module" or "module:suffix"
    help: str
    example: str
    needs_daemon: bool = False  # an error is followed by how to start one when none runs
    # `--json` is a switch printing to stdout (`_json_flag`), known before the command's modules
    # load: a Ctrl-C while they import still gives a script its document
    json_switch: bool = False


# top-level modules of the optional extras (vaultsim[mcp], vaultsim[ray]): only these may be missing
OPTIONAL_EXTRAS = frozenset({"mcp", "mcp_types", "ray"})

COMMANDS: dict[str, Command] = {
    "run": Command("vault.cli.run", "run scenarios in fresh processes and decide the release",
                   "vaultsim run -k 'gate and not naive' --junit report.xml   # the shipped suite"),
    "report": Command("vault.runner.merge", "merge shard reports (`run --shard K/N --json F`) into one decision",
                      "vaultsim report merge shard-*.json --junit report.xml"),
    "init": Command("vault.cli.init", "copy a starter suite (catalog, policy, scenarios) to edit",
                    "vaultsim init my-suite && vaultsim run my-suite"),
    "daemon": Command("vault.cli.daemon:daemon", "start the vault daemon",
                      "vaultsim daemon --home /tmp/vs --remote http://127.0.0.1:8080 --unlocked", json_switch=True),
    "stop": Command("vault.cli.daemon:stop", "stop the vault daemon", "vaultsim stop --home /tmp/vs"),
    "status": Command("vault.cli.daemon:status", "show whether a daemon serves this home, and if locked",
                      "vaultsim status --json || echo \"not serving (exit $?)\"", json_switch=True),
    "lock": Command("vault.cli.approver:lock", "lock the vault (through the approver channel)",
                    "vaultsim lock --home /tmp/vs", needs_daemon=True, json_switch=True),
    "unlock": Command("vault.cli.approver:unlock", "unlock the vault (through the approver channel)",
                      "vaultsim unlock --json", needs_daemon=True, json_switch=True),
    "secret": Command("vault.cli.secret", "set, list or remove credentials (values never printed)",
                      "printf '%s' \"$TOKEN\" | vaultsim secret set tracker_token", json_switch=True),
    "approve": Command("vault.approvers.scripted", "scripted approver: answer prompts from rules",
                       "vaultsim approve --script approvers/allow-session.yaml", needs_daemon=True),
    "tui": Command("tui.cli", "the Textual approver", "vaultsim tui --home /tmp/vs"),
    "demo": Command("tui.demo", "one-command interactive demo (quit with q)", "vaultsim demo"),
    "audit": Command("vault.cli.audit", "verify (offline) or show (with the key) the audit log",
                     "vaultsim audit verify --json", json_switch=True),
    "stats": Command("vault.cli.approver:stats", "prompt counts and scopes",
                     "vaultsim stats --run demo --json", needs_daemon=True, json_switch=True),
    "policy": Command("vault.cli.policy", "suggest a policy that would have asked less, from run reports",
                      "vaultsim policy suggest report.json --max-risk update -o suggested.yaml", json_switch=True),
    "remote": Command("vault.cli.remote", "the fault-injecting fake remote, standalone",
                      "vaultsim remote --port 8080 --credentials creds.json --fault rate_limited"),
    "diag": Command("vault.cli.diag", "show a protected diagnostic, for an operator",
                    "vaultsim diag show d-01J..."),
    "schema": Command("vault.cli.schema", "print a JSON Schema: report, scenario, policy, catalog, result",
                      "vaultsim schema report > report.schema.json"),
    # no needs_daemon hint: mcp says itself how to start one (it knows the socket it tried)
    "mcp": Command("vault.cli.mcp", "MCP server (stdio, or HTTP on loopback) forwarding to the daemon",
                   "vaultsim mcp --home /tmp/vs --wait-budget 50"),
    "exec": Command("vault.cli.exec", "run a program in the agent jail with the agent socket, never a secret",
                    "vaultsim exec --workdir . -- python my_agent.py", needs_daemon=True),
    "completion": Command("vault.cli.completion", "print the shell completion script: bash, zsh or fish",
                          "eval \"$(vaultsim completion bash)\"   # in ~/.bashrc"),
}

# examples for the actions of commands that have them (`vaultsim secret set --help`)
ACTION_EXAMPLES = {
    "secret set": "printf '%s' \"$TOKEN\" | vaultsim secret set tracker_token",
    "secret list": "vaultsim secret list --json",
    "secret rm": "vaultsim secret rm tracker_token",
    "audit verify": "vaultsim audit verify /tmp/vs/audit.log --json",
    "audit show": "vaultsim audit show --correlation c-01J...",
    "diag show": "vaultsim diag show d-01J...",
    "policy suggest": "vaultsim policy suggest report.json --max-risk update -o suggested.yaml",
    "report merge": "vaultsim report merge shard-*.json --json report.json --junit report.xml",
}


class _UsageError(SystemExit):
    """argparse's usage error (exit 2), said as argparse says it, and caught by `_main` to add
    the JSON document of `--json`. A SystemExit still, for whoever parses without `_main`."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise _UsageError(message)


def _json_flag(parser: argparse.ArgumentParser) -> bool:
    """Whether the command (or one of its actions) has the `--json` switch that prints to stdout
    (`run --json FILE` writes a file: not this)."""
    for action in parser._actions:
        if isinstance(action, argparse._StoreTrueAction) and "--json" in action.option_strings:
            return True
        if isinstance(action, argparse._SubParsersAction):
            if any(_json_flag(sub) for sub in action.choices.values()):
                return True
    return False


def json_error(args: argparse.Namespace | None, message: str, code: int, **extra: object) -> None:
    """Under `--json`, an error is also a JSON object on stdout, so a script that parses stdout
    gets a document and not nothing; the exit code is the same as without `--json`."""
    if args is None or getattr(args, "json", None) is not True:
        return
    print(json.dumps({"error": message, "exit_code": code, **extra}, sort_keys=True), flush=True)


def fail(name: str, args: argparse.Namespace, message: str, code: int, **extra: object) -> int:
    """A command's error: one line on stderr (and its JSON under `--json`); returns the exit code."""
    print(f"vaultsim {name}: {message}", file=sys.stderr)
    json_error(args, message, code, **extra)
    return code


def interrupted_line(name: str) -> str:
    """What a command says on Ctrl-C (exit 130), on stderr: one line, never a traceback."""
    return f"vaultsim {name}: interrupted (Ctrl-C); stopped"


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=30)


def _top_parser() -> argparse.ArgumentParser:
    width = max(map(len, COMMANDS))
    p = argparse.ArgumentParser(
        prog="vaultsim",
        description="Approval and credential vault simulator for testing AI agents.",
        epilog="commands:\n" + "\n".join(f"  {name:<{width}}  {c.help}" for name, c in COMMANDS.items())
        + "\n\n`vaultsim COMMAND --help` shows a command's options and an example.\n\n" + EXIT_CODES,
        formatter_class=_formatter,
    )
    p.add_argument("--version", action="version", version=f"vaultsim {__version__}")
    p.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help="see below")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the command's own (see its --help)")
    return p


# what every command module defines: configure(parser) and run(args) -> exit code (None: 0)
Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], "int | None"]


def _resolve(name: str) -> tuple[Configure, Run]:
    target, _, suffix = COMMANDS[name].target.partition(":")
    module = importlib.import_module(target)
    configure = getattr(module, f"configure_{suffix}" if suffix else "configure")
    run = getattr(module, f"run_{suffix}" if suffix else "run")
    return configure, run


def command_parser(name: str, configure: Configure) -> argparse.ArgumentParser:
    """The parser of one command, with its example under `--help` (and its actions')."""
    c = COMMANDS[name]
    # _Parser: its actions' parsers are of the same class (argparse's parser_class default)
    parser = _Parser(prog=f"vaultsim {name}", description=c.help,
                     epilog=f"example:\n  {c.example}", formatter_class=_formatter)
    configure(parser)
    for action in parser._actions:  # argparse keeps sub-commands here and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                example = ACTION_EXAMPLES.get(f"{name} {sub_name}")
                if example and not sub.epilog:
                    sub.epilog, sub.formatter_class = f"example:\n  {example}", _formatter
    return parser


def _complete() -> None:
    """Answer the shell's completion request (argcomplete) and exit; every command's parser is built."""
    import argcomplete

    top = argparse.ArgumentParser(prog="vaultsim")
    top.add_argument("--version", action="store_true")
    sub = top.add_subparsers(dest="command")
    for name, c in COMMANDS.items():
        p = sub.add_parser(name, help=c.help)
        try:
            _resolve(name)[0](p)
        except ImportError as exc:  # an optional extra not installed: the name still completes
            if (exc.name or "").split(".")[0] not in OPTIONAL_EXTRAS:
                raise
    argcomplete.autocomplete(top)


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:
            stdout.flush()  # a reader that left shows here, not as "Exception ignored" at exit
    except BrokenPipeError:  # `vaultsim ... | head -1`: the reader has what it wanted
        stdout.discard()
        return 1
    except OSError as exc:
        if exc.errno not in stdout.NO_ROOM:
            raise
        stdout.discard()
        print(f"vaultsim: cannot write to stdout: {exc.strerror}", file=sys.stderr)
        return 3


def _main(argv: list[str] | None) -> int:
    if argv is None and "_ARGCOMPLETE" in os.environ:
        _complete()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        top = _top_parser()
        if not argv:
            top.print_help(sys.stderr)
            return 2
        if argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
            # argparse would say "COMMAND is required"; `vaultsim --home D status` is the usual slip
            top.error(f"unrecognized option {argv[0]!r} before the command; "
                      f"a command's options go after it: vaultsim COMMAND {argv[0]} ...")
        top.parse_args(argv[:1])  # --help, --version, or an unknown command: argparse answers
        return 2
    name = argv[0]
    try:
        # a Ctrl-C while the command's modules import is an interrupt like any other (130), not a traceback
        configure, run = _resolve(name)
    except KeyboardInterrupt:
        print(interrupted_line(name), file=sys.stderr)
        if COMMANDS[name].json_switch and "--json" in argv[1:]:
            json_error(argparse.Namespace(json=True), "interrupted (Ctrl-C)", 130)
        return 130
    parser = command_parser(name, configure)
    try:
        args = parser.parse_args(argv[1:])
    except _UsageError as exc:  # said on stderr; with --json, said on stdout too
        if "--json" in argv[1:] and _json_flag(parser):
            json_error(argparse.Namespace(json=True), exc.message, 2, usage=True)
        return 2
    try:
        return int(run(args) or 0)
    except BadInput as exc:
        return fail(name, args, exc.message, 2)
    except VaultError as exc:
        print(f"vaultsim {name}: {exc.message}", file=sys.stderr)
        hint = _hint_start_daemon(args) if COMMANDS[name].needs_daemon else None
        json_error(args, exc.message, 1, **({"hint": hint} if hint else {}))
        return 1
    except KeyboardInterrupt:
        return _interrupted_exit(name, args)
    except OSError as exc:
        if isinstance(exc, BrokenPipeError) and stdout.closed():
            raise  # stdout's reader left: not a bug, main stops quietly
        if exc.errno not in stdout.NO_ROOM:
            return _internal_error(name, args)
        # no room on the disk (or for stdout): an infrastructure error, said in one line
        message = f"cannot write: {exc.strerror}"
        print(f"vaultsim {name}: {message}", file=sys.stderr)
        with contextlib.suppress(OSError):  # stdout may be the very file with no room
            json_error(args, message, 3)
        stdout.settle()
        return 3
    except Exception as exc:
        if _interrupted(exc):
            return _interrupted_exit(name, args)
        return _internal_error(name, args)


def _interrupted_exit(name: str, args: argparse.Namespace) -> int:
    print(interrupted_line(name), file=sys.stderr)
    json_error(args, "interrupted (Ctrl-C)", 130)
    return 130


def _interrupted(exc: BaseException) -> bool:
    """A Ctrl-C that a library caught and wrapped (pydantic turns one raised while it builds a
    schema into a SchemaError): an interrupt, not a bug."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt) or (type(cur).__name__ == "SchemaError"
                                                  and "KeyboardInterrupt" in str(cur)):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def _internal_error(name: str, args: argparse.Namespace | None = None) -> int:
    """A bug: say so plainly, keep the traceback for the report (stderr), exit like pytest."""
    traceback.print_exc()
    print(f"vaultsim {name}: internal error (a bug in vaultsim; the traceback above helps fix it)",
          file=sys.stderr)
    json_error(args, "internal error (a bug in vaultsim; its traceback is on stderr)", 3)
    return 3


def _hint_start_daemon(args: argparse.Namespace) -> str | None:
    """After an error of a command that needs a daemon: if none serves the home, say how to start
    one (on stderr; returned for the JSON of `--json`)."""
    from vault.cli.daemon import daemon_status
    from vault.home import VaultHome

    try:
        home = VaultHome.resolve(getattr(args, "home", None))
    except VaultError:
        return None
    from vault.cli.daemon_probe import held_by
    held = held_by(home, wait_s=0)
    if held is not None and held.state == "stopped":  # its error said so; a connection would wait
        return None
    if daemon_status(home, timeout=2) is not None:
        return None  # a refusal from a running daemon is its own, not a missing daemon's
    if held is not None:  # one holds the home but answers no socket: never "start one"
        hint = held.why(str(home.root))
    else:
        where = f" --home {home.root}" if getattr(args, "home", None) else ""
        hint = (f"no daemon serves {home.root}; start one with `vaultsim daemon{where}` "
                "(add --unlocked to skip `vaultsim unlock`)")
    print(f"hint: {hint}", file=sys.stderr)
    return hint


def path_arg(text: str) -> str:
    """argparse type of every file or directory argument. An empty one (`--policy "$UNSET"`) is
    refused: read as given it was the current directory, and tested for truth it was the option
    left out, so a daemon started with the default policy instead of the one meant."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path: give a file or directory")
    return text


def add_home_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", help="vault home (default: $VAULTSIM_HOME or the user data dir)")


if __name__ == "__main__":
    sys.exit(main())
