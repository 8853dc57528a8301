"""The reports a run or a merge writes (`--json`, `--junit`), each all or nothing.

Every one asked for is tried, even when another could not be written: a JSON report
on a full disk no longer costs the JUnit file on another disk. A failure is said in one
line per file, the file there kept as it was (the run's table on stdout still stands).
Exit 3 when the machine had no room (a full disk, a quota, an I/O error), as for stdout on
a full disk: an infrastructure error, per README's exit codes; 2 for anything else about
the path the user gave (checked before the run, so it changed meanwhile).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from vault.cli.stdout import NO_ROOM
from vault.runner.junit import write_junit
from vault.runner.report_schema import write_json

EXIT_NOT_WRITTEN, EXIT_NO_ROOM = 2, 3


def write_reports(doc: dict[str, Any], json_path: str | None, junit_path: str | None, command: str) -> int | None:
    """Write the reports asked for; None when every one was written, else the exit code."""
    code: int | None = None
    for option, path, write in (("--json", json_path, write_json), ("--junit", junit_path, write_junit)):
        if not path:
            continue
        try:
            write(Path(path), doc)
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            print(f"vaultsim {command}: {option}: cannot write {path}: {why}; the file there is as it was",
                  file=sys.stderr)
            this = EXIT_NO_ROOM if exc.errno in NO_ROOM else EXIT_NOT_WRITTEN
            code = max(code or 0, this)
    return code
