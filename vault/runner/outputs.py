"""The reports a run or a merge writes (`--json`, `--junit`), each all or nothing.

Every one asked for is tried, even when another could not be written: a JSON report
on a full disk no longer costs the JUnit file on another disk. A failure is said in one
line per file, the file there kept as it was (the run's table on stdout still stands).
Exit 3 when the machine had no room (a full disk, a quota, an I/O error), as for stdout on
a full disk: an infrastructure error, per README's exit codes; 2 for anything else about
the path the user gave (checked before the run, so it changed meanwhile).

A report is written into what its path names (a pipe, `/dev/stdout`) only when that is what the
path named before the run: an unjailed agent reads the path on the runner's command line, and a
FIFO nobody reads put there held the runner in its last write for ever, a link to /dev/null put
there lost the report (red team 48u). A path changed while the run ran is replaced with the
report, and said; one whose directory was replaced (a link to another) is not written, so the
runner never writes where an agent pointed it.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any, NamedTuple

from vault.cli.stdout import NO_ROOM
from vault.runner.junit import write_junit
from vault.runner.report_schema import write_json

EXIT_NOT_WRITTEN, EXIT_NO_ROOM = 2, 3


class Seen(NamedTuple):
    """What a report's path named: the entry itself, what it leads to, and the directory it is in
    (device, inode, mode)."""
    entry: tuple[int, int, int] | None
    target: tuple[int, int, int] | None
    where: tuple[int, int, int] | None


def _ident(path: Path, follow: bool) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=follow)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mode)


def seen(path: Path) -> Seen:
    return Seen(_ident(path, False), _ident(path, True), _ident(Path(os.path.abspath(path)).parent, True))


def _through(before: Seen) -> bool:
    """Written into, not replaced: a pipe or a device that was there before the run."""
    return before.target is not None and (stat.S_ISFIFO(before.target[2]) or stat.S_ISCHR(before.target[2]))


def write_reports(doc: dict[str, Any], json_path: str | None, junit_path: str | None, command: str,
                  before: dict[str, Seen] | None = None) -> int | None:
    """Write the reports asked for; None when every one was written, else the exit code. `before`:
    each option's path as `seen` before the run (a run's agents could reach it; a merge's, none)."""
    code: int | None = None
    for option, path, write in (("--json", json_path, write_json), ("--junit", junit_path, write_junit)):
        if not path:
            continue
        was = (before or {}).get(option)
        now = seen(Path(path))
        if was is not None and now.where != was.where:
            # its directory swapped for a link elsewhere: the runner (root, maybe) would write where
            # the agent chose
            print(f"vaultsim {command}: {option}: cannot write {path}: its directory was replaced while the run "
                  "ran (not by the runner); nothing written there", file=sys.stderr)
            code = max(code or 0, EXIT_NOT_WRITTEN)
            continue
        changed = was is not None and now != was
        if changed:
            print(f"vaultsim {command}: {option}: {path} was changed while the run ran (not by the runner): "
                  "replaced with this run's report", file=sys.stderr)
        try:
            write(Path(path), doc, None if was is None else (not changed and _through(was)))
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            left = ("what is there is not this run's report (it was changed while the run ran)" if changed
                    else "the file there is as it was")
            print(f"vaultsim {command}: {option}: cannot write {path}: {why}; {left}", file=sys.stderr)
            this = EXIT_NO_ROOM if exc.errno in NO_ROOM else EXIT_NOT_WRITTEN
            code = max(code or 0, this)
    return code
