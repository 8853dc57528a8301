"""The files a trial's approvals and grading are read from, and whether an agent changed them.

Why: an unjailed agent read its scenario's path from an ancestor's command line (every user
reads it), found the scenario's `policy:` file and rewrote every mode in it to `auto`, then did
its task: PASS, though the next daemon to read that policy (the next trial of the run, the next
run) asks nobody, and a careful agent there was graded for what the prompts it never saw would
have stopped. A policy is the rules the vault's approvals are decided by: rewriting it decides
approvals, as a `decide` on the approver socket does. The same goes for the scenario file (its
approver rules and expectations), its approver's script, the plans its agents' tasks come from
and the catalog (each operation's risk class, which the policy decides by). In a jail these are
read-only (the host's files) or absent; without one the runner looks at them after each agent.

Each file is known by its contents (an editor's save replaces the inode, and a new inode with
the same bytes changes nothing); a file that was missing stays missing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from vault import regular
from vault.resources import CATALOG, DEFAULT_POLICY
from vault.runner.scenario import Scenario

BYTES_MOST = 16 << 20  # a scenario's files are a few KiB; a bigger one is hashed by its first bytes


def paths(sc: Scenario) -> list[Path]:
    """The scenario file, its policy (or the shipped default), its approver's script, its
    agents' plan and step files, and the catalog its operations come from."""
    out: list[Path] = [CATALOG, sc.relative(sc.policy) if sc.policy else DEFAULT_POLICY]
    if sc.path is not None:
        out.append(sc.path)
    if sc.approver is not None and sc.approver.file:
        out.append(sc.relative(sc.approver.file))
    for spec in sc.agents:
        out += [sc.relative(f) for f in (spec.plan, spec.steps) if isinstance(f, str)]
    return list(dict.fromkeys(p.absolute() for p in out))


def look(files: list[Path]) -> dict[str, str]:
    """path -> the SHA-256 of its contents ("" where it cannot be read: missing, or no longer a
    regular file, as a FIFO put in its place, which is never opened to wait for a writer)."""
    out: dict[str, str] = {}
    for path in files:
        try:
            out[str(path)] = hashlib.sha256(regular.read_bytes(path, BYTES_MOST, cut=True)).hexdigest()
        except OSError:  # regular.NotRegular included
            out[str(path)] = ""
    return out


def changed(was: dict[str, str], now: dict[str, str]) -> list[str]:
    return [path for path, digest in was.items() if now.get(path, "") != digest]
