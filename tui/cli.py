"""`vaultsim tui [--home D] [--name N] [--run ID]`: open the approver on a vault home.

The daemon need not be running yet: the TUI shows that it is disconnected and
connects as soon as a daemon answers on the home's approver socket.
"""

from __future__ import annotations

import argparse
import signal
import sys

from vault.cli.main import add_home_arg
from vault.errors import BadInput
from vault.home import VaultHome
from vault.stop_signals import caught


def need_terminal() -> None:
    """Textual draws on stderr and reads keys from stdin: without a terminal on both, the app
    would draw into a file or a pipe and wait for keys that never come (a CI job hung)."""
    streams = (sys.__stdin__, sys.__stderr__)
    if not all(s is not None and s.isatty() for s in streams):
        raise BadInput("needs a terminal on stdin and stderr; without one, answer prompts with "
                       "`vaultsim approve --script F`")


def configure(p: argparse.ArgumentParser) -> None:
    add_home_arg(p)
    p.add_argument("--name", default="human",
                   help="approver name; a policy `owner` routes requests to it (default: human)")
    p.add_argument("--run", dest="run_id", help="count prompts for this run id (default: the latest)")


def run(args: argparse.Namespace) -> int:
    from vault.proc_guard import make_undumpable

    need_terminal()
    from tui.app import VaultApp  # Textual is imported only when the TUI is asked for

    make_undumpable()  # the approver: it holds the approver token

    app = VaultApp(VaultHome.resolve(args.home), name=args.name, run_id=args.run_id)

    def stop(signum: int, _frame: object) -> None:
        # a signal from outside (kill, a job control script): leave the terminal as it was and
        # say so in the status, 128 + the signal, as a shell does; `q` is the normal exit (0)
        app.exit(return_code=128 + signum)

    # SIGHUP (its terminal closed) as TERM; one ignored at start (`nohup`) stays ignored
    for sig in caught():
        signal.signal(sig, stop)
    app.run()
    return app.return_code or 0
