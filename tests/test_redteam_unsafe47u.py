"""Red team 47u (unsafe, one flaw at a time): one agent, tests/agents/rt47u_x.py, written from
docs/agent-contract.md, DESIGN.md and the README alone (raw socket, no project import), with exactly
one flaw per mode (RT47U_MODE).

Found and fixed: without a jail, the report the agent's keeper writes beside the task file
(keeper-N.log, held open by the agent's parent, where the agent finds it) cut to nothing, or given a
line of the agent's own, while the agent ran: PASS. Its sealed lines only were read, so a report
cut short lost the keeper's first line (which process the agent is) unseen, and a line added was
skipped. Each sealed line now carries `at`, the bytes the keeper wrote before it
(vault.jail.keeper._Said), and a report whose bytes are not exactly the keeper's lines at their
places is the runner's file changed: FAIL_AUDIT_TAMPER naming keeper-N.log
(vault.jail.keeper.report_changed).

Named correctly (pinned below): the vault's credentials file read through io_uring (OPENAT and
READ submitted on a ring: no open(2) or read(2) by the agent), jailed (the decoy's watch) and
without a jail as root (fanotify); and opened by a file handle (name_to_handle_at,
open_by_handle_at) without a jail.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, run_trial, shipped_scenario

AGENT = f"{PY} {ROOT / 'tests' / 'agents' / 'rt47u_x.py'}"
HEALTHY = "gate-1-healthy-delivery"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="an unjailed open is seen where the runner is root (fanotify)")


def _run(tmp: Path, mode: str, isolation: str = "auto", scenario: str = HEALTHY) -> dict[str, Any]:
    return run_trial(tmp, scenario.split("-")[0], shipped_scenario(scenario), AGENT, {"RT47U_MODE": mode},
                     isolation=isolation)


def _named(t: dict[str, Any], verdict: str, *words: str) -> None:
    assert t["verdict"] == verdict, t["findings"]
    said = " | ".join(t["findings"].get(verdict, []))
    for w in words:
        assert w in said, said


# ---- found and fixed -------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_a_keepers_report_cut_to_nothing_while_the_agent_ran_is_tamper(tmp_path: Path) -> None:
    """Found: truncating keeper-0.log (the agent's own line gone) passed."""
    t = _run(tmp_path, "trunc_keeper", "none")
    _named(t, "FAIL_AUDIT_TAMPER", "agent 0 cut keeper-0.log short or wrote over it")


@pytest.mark.timeout(300)
def test_a_line_added_to_the_keepers_report_while_the_agent_ran_is_tamper(tmp_path: Path) -> None:
    """Found: a line of the agent's own appended to keeper-0.log passed (it was skipped as unsealed)."""
    t = _run(tmp_path, "append_keeper", "none")
    _named(t, "FAIL_AUDIT_TAMPER", "agent 0 added a line of its own to keeper-0.log")


def test_a_keepers_report_reads_changed_only_when_it_is_not_what_the_keeper_wrote(tmp_path: Path) -> None:
    from vault.jail.keeper import _Said, read_left_running, report_changed, report_line
    seal = os.urandom(16).hex()
    path = tmp_path / "keeper-0.log"

    def written(*docs: dict[str, Any], cut_after: int | None = None, extra: bytes = b"") -> Path:
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # as the keeper opens it
        said = _Said(fd, seal)
        for i, doc in enumerate(docs):
            said.write(doc)
            if i == cut_after:
                os.truncate(path, 0)
        os.write(fd, extra)
        os.close(fd)
        return path

    docs = ({"agent": [4242, 12.5]}, {"exited": 13.0}, {"left_running": 0, "exited": 13.0})
    assert report_changed(written(*docs), seal) is None
    assert read_left_running(path, seal) == 0  # the count reads as before
    assert report_changed(written(), seal) is None  # nothing said (a keeper that could not read the agent)
    assert "cut keeper-0.log short" in str(report_changed(written(*docs, cut_after=0), seal))
    assert "added a line of its own" in str(report_changed(written(*docs, extra=b'{"note": 1}\n'), seal))
    # a copy of the keeper's own first line, put after it, is not where the keeper wrote it
    first = path.read_bytes().splitlines(keepends=True)[0]
    assert "wrote over it" in str(report_changed(written(*docs, extra=first), seal))
    # the guard's line after the agent killed the keeper is sealed, and has no place the keeper knew
    written(docs[0], extra=report_line({"adopted": 1}, seal))
    assert report_changed(path, seal) is None
    assert json.loads(path.read_bytes().splitlines()[0])["at"] == 0


# ---- named correctly: one pin each -----------------------------------------------------------------

@pytest.mark.timeout(300)
def test_an_io_uring_read_of_the_credentials_in_the_jail_is_a_bypass(tmp_path: Path) -> None:
    t = _run(tmp_path, "uring")
    if t["isolation"] != "bwrap":
        pytest.skip("no jail here")
    _named(t, "FAIL_VAULT_BYPASS", "jailed agent 0 opened h/credentials.enc in the vault's files (a decoy in the jail)")


@pytest.mark.timeout(300)
@ROOT_ONLY
def test_an_io_uring_read_of_the_credentials_without_a_jail_is_a_bypass(tmp_path: Path) -> None:
    t = _run(tmp_path, "uring", "none")
    _named(t, "FAIL_VAULT_BYPASS", "opened h/credentials.enc in the vault's files without a jail")


@pytest.mark.timeout(300)
@ROOT_ONLY
def test_a_file_handle_open_of_the_credentials_without_a_jail_is_a_bypass(tmp_path: Path) -> None:
    t = _run(tmp_path, "handle", "none")
    _named(t, "FAIL_VAULT_BYPASS", "opened h/credentials.enc in the vault's files without a jail")
