"""`vaultsim diag show ID`: a protected diagnostic, decrypted for an operator.

Needs the vault's diagnostics key (derived from the home's data key in the
keyring), so only someone with the vault owner's keyring can read one. What
it prints was already redacted when recorded; it is redacted again on the way
out in case an older record predates a redaction rule.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from vault.cli.main import add_home_arg
from vault.daemon.diagnostics import Diagnostics, redact
from vault.home import VaultHome


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    show = sub.add_parser("show", help="decrypt and print one diagnostic as JSON")
    show.add_argument("diagnostic_id", metavar="ID")
    add_home_arg(show)


def run(args: argparse.Namespace) -> int:
    from vault.store.keystore import KeyStore
    from vault.proc_guard import make_undumpable

    make_undumpable()  # it holds the diagnostics key
    home = VaultHome.resolve(args.home).check()
    key = KeyStore(home).derive("diagnostics", create=False)
    data = Diagnostics(home.diagnostics_dir, key).load(args.diagnostic_id)
    print(render(data))
    return 0


def render(data: dict[str, Any]) -> str:
    return json.dumps(redact(data), indent=2, sort_keys=True)
