"""`vaultsim secret set|list|rm`: manage credentials without ever printing one.

A value comes in on stdin (or a getpass prompt on a terminal), never on the
command line, where `ps` and shell history would see it.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys

from vault.cli.main import add_home_arg
from vault.errors import BadInput
from vault.home import VaultHome
from vault.store.keystore import KeyStore
from vault.store.credentials import NAME_RULE, CredentialStore, check_name

MAX_VALUE_BYTES = 1 << 20


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser("set", help="set a credential; the value is read from stdin")
    p.add_argument("name", metavar="NAME", help=NAME_RULE)
    add_home_arg(p)
    p = sub.add_parser("list", help="list credential names and dates (never values)")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    add_home_arg(p)
    p = sub.add_parser("rm", help="remove a credential")
    p.add_argument("name", metavar="NAME")
    add_home_arg(p)


def run(args: argparse.Namespace) -> int:
    from vault.proc_guard import make_undumpable
    make_undumpable()  # a value typed on stdin, and the data key, pass through this process
    home = VaultHome.resolve(args.home)
    # a home that is a symlink, someone else's or open to others is refused before any
    # value is read or shown, for listing too (exit 2, with the reason and the fix)
    if args.action == "list":
        home.check()  # listing creates nothing
    else:
        home.ensure()
    store = CredentialStore(home, KeyStore(home))
    if args.action == "set":
        name = check_name(args.name)  # before reading: no value typed for nothing
        store.set(name, _read_value(name))
        print(f"credential '{name}' set", file=sys.stderr)
    elif args.action == "list":
        infos = store.list()
        if args.json:
            print(json.dumps([i.to_dict() for i in infos], indent=2))
        elif not infos:
            print("no credentials set", file=sys.stderr)
        else:
            width = max(len("NAME"), *(len(i.name) for i in infos))
            print(f"{'NAME':<{width}}  {'CREATED':<25}  UPDATED")
            for i in infos:
                print(f"{i.name:<{width}}  {i.created.isoformat(timespec='seconds'):<25}  "
                      f"{i.updated.isoformat(timespec='seconds')}")
    else:
        store.remove(check_name(args.name))
        print(f"credential '{args.name}' removed", file=sys.stderr)
    return 0


def _read_value(name: str) -> str:
    if sys.stdin is None:  # `<&-`: no stdin at all reads as an empty one
        value = ""
    elif sys.stdin.isatty():
        value = getpass.getpass(f"value for {name}: ")
    else:
        raw = sys.stdin.buffer.read(MAX_VALUE_BYTES + 1)
        if len(raw) > MAX_VALUE_BYTES:
            raise BadInput("credential value is larger than 1 MiB")
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadInput("credential value on stdin is not UTF-8 text") from None
        # `echo VALUE |` adds one newline; anything else is part of the value
        if value.endswith("\r\n"):
            value = value[:-2]
        elif value.endswith("\n"):
            value = value[:-1]
    if not value:
        raise BadInput("empty value: pipe the value on stdin, e.g. printf %s \"$TOKEN\" | "
                       f"vaultsim secret set {name}")
    return value
