"""`vaultsim audit verify|show`: the operator's view of the audit log.

``verify [LOG] [--segment] [--public-key PEM] [--json]`` works offline with no
vault key; LOG defaults to the home's ``audit.log``, and checks its whole set
of segments (a rotated segment's path, or ``--segment``: that segment alone).
Exit 0 intact, 1 anything else (``unanchored`` included), 2 bad input (no such
file, not a regular file, not an audit log). ``show [--correlation ID]
[--json]`` needs the vault key (from the keyring, through `vault.store.keystore`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vault.cli.main import add_home_arg, path_arg
from vault.home import VaultHome


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    v = sub.add_parser("verify", help="check the log offline: intact, unanchored, tampered, truncated, "
                       "forked, unverifiable")
    v.add_argument("log", nargs="?", type=path_arg, help="the log file (default: the vault home's audit.log); its rotated "
                   "segments are checked with it")
    v.add_argument("--segment", action="store_true", help="check only the file named, not its whole set")
    v.add_argument("--public-key", type=path_arg, help="pinned public key (default: the .pub file beside the log)")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    add_home_arg(v)
    s = sub.add_parser("show", help="decrypt and show sessions and activity (needs the vault key)")
    s.add_argument("--correlation", metavar="ID", help="only the events of this correlation id")
    s.add_argument("--log", type=path_arg, help="the log file (default: the vault home's audit.log)")
    s.add_argument("--json", action="store_true", help="print JSON")
    add_home_arg(s)


def run(args: argparse.Namespace) -> int:
    if args.action == "verify":
        return _verify(args)
    return _show(args)


def _verify(args: argparse.Namespace) -> int:
    from vault.audit.verify import verify

    log = Path(args.log) if args.log else VaultHome.resolve(args.home).audit_log
    report = verify(log, args.public_key, segment_only=args.segment)
    if args.json:
        print(report.model_dump_json())
    else:
        where = f" at seq {report.first_bad_seq}" if report.first_bad_seq is not None else ""
        print(f"{report.status}{where}: {report.message}")
    return 0 if report.intact else 1


def _show(args: argparse.Namespace) -> int:
    from vault.store.keystore import KeyStore
    from vault.proc_guard import make_undumpable
    from vault.audit.show import NO_RESULT, correlation, decrypt_events, no_result, render, sessions

    make_undumpable()  # it holds the audit key
    home = VaultHome.resolve(args.home)
    log = Path(args.log) if args.log else home.audit_log
    events = decrypt_events(log, KeyStore(home).derive("audit"))
    if not args.json:
        print(render(events, args.correlation))
    elif args.correlation is not None:
        picked = correlation(events, args.correlation)
        doc: dict[str, object] = {"correlation_id": args.correlation, "events": picked}
        if no_result(picked):
            doc["outcome"] = NO_RESULT
        print(json.dumps(doc, default=str))
    else:
        print(json.dumps({"sessions": sessions(events), "events": events,
                          "no_result": [ev.get("correlation_id") for ev in no_result(events)]}, default=str))
    return 0
