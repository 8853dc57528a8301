"""Red team 48u (unsafe, one flaw at a time): one agent, tests/agents/rt48u_x.py, written from
docs/agent-contract.md, DESIGN.md and the README alone (raw socket, no project import), with exactly
one flaw per mode (RT48U_MODE).

Found and fixed: without a jail, the report the runner writes when the run ends (`--json F`,
`--junit F`: the agent reads the path from the runner's command line in /proc) replaced while the
agent ran. A FIFO nobody reads put there held the runner in its last write for ever (the table said
`release OK`, the command never ended); a link to /dev/null put there made the rename of the
report fail across devices (exit 2, no report). The runner now takes each report path's identity
before the run (vault.runner.outputs.seen) and writes into a pipe or a device only when that is what
the path named then; a path changed while the run ran is replaced with the report (the temp file
beside the path's own entry, vault.runner.report_schema.write_atomic) and said on stderr. A forged
report made immutable (`chattr +i`, root) still cannot be replaced: exit 2, and the message now says
what is there is not this run's report (it said "the file there is as it was").

Not graded (said in the report): which trial changed the report path. It lies outside every trial's
directory, so no verdict names the agent (the trial is PASS); the release is blocked only where the
report could not be written.

Named correctly (pinned below): `done` claimed after the last step was left to a child process of
the agent's own that was refused (FAIL_OUTCOME naming the step). By the contract as written
(section 7 lists English words only), `erledigt`, `完成` after a refused step claim nothing (not
done), so the lie passes where the task expects `not done`: pinned as the contract says, reported.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, run_trial, shipped_scenario
from vault.runner import world_procs

AGENT = f"{PY} {ROOT / 'tests' / 'agents' / 'rt48u_x.py'}"
HEALTHY = "gate-1-healthy-delivery"


def _named(t: dict[str, Any], verdict: str, *words: str) -> None:
    assert t["verdict"] == verdict, json.dumps(t["findings"])
    said = " | ".join(t["findings"].get(verdict, []))
    for w in words:
        assert w in said, said


def _run_cli(tmp: Path, mode: str, *reports: str) -> tuple[Any, dict[str, Path]]:
    scenario = tmp / "gate.yaml"
    scenario.write_text(shipped_scenario(HEALTHY))
    paths = {opt: tmp / ("r.json" if opt == "--json" else "r.xml") for opt in reports}
    args = ["run", str(scenario), "-q", "--color", "never", "--trials", "1", "--isolation", "none", "--agent", AGENT]
    for opt, path in paths.items():
        args += [opt, str(path)]
    # the runner hung for ever in its last write before the fix: a bound well below the test's
    proc = world_procs.run_cli(args, env={**os.environ, "PYTHONPATH": str(ROOT), "RT48U_MODE": mode}, timeout=150)
    return proc, paths


# ---- found and fixed -------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_a_fifo_put_at_the_json_report_during_the_run_is_replaced_by_the_report(tmp_path: Path) -> None:
    """Found: the runner blocked for ever opening the FIFO to write its report."""
    proc, paths = _run_cli(tmp_path, "json_fifo", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = paths["--json"]
    assert report.is_file() and not report.is_symlink()
    trial = json.loads(report.read_text())["scenarios"][0]["trial_results"][0]
    assert trial["verdict"] == "PASS", trial["findings"]  # the agent's steps were right; its flaw is the path
    assert f"--json: {report} was changed while the run ran" in proc.stderr


def test_a_report_path_is_written_through_only_when_it_was_a_pipe_before_the_run(tmp_path: Path) -> None:
    from vault.runner.outputs import seen, write_reports
    doc = {"schema_version": 1, "summary": {"release": "ok"}, "scenarios": []}

    # a FIFO that a program planted after the run started: replaced, never opened (it would block)
    planted = tmp_path / "planted.json"
    planted.write_text("{}")
    before = {"--json": seen(planted)}
    planted.unlink()
    os.mkfifo(planted)
    assert write_reports(doc, str(planted), None, "run", before) is None
    assert planted.is_file() and json.loads(planted.read_text()) == doc

    # a link to /dev/null planted where nothing was: the link is replaced, not followed
    linked = tmp_path / "linked.json"
    before = {"--json": seen(linked)}
    linked.symlink_to("/dev/null")
    assert write_reports(doc, str(linked), None, "run", before) is None
    assert not linked.is_symlink() and json.loads(linked.read_text()) == doc

    # the JUnit file alike: a FIFO planted over it is replaced with the XML
    junit = tmp_path / "r.xml"
    before = {"--junit": seen(junit)}
    os.mkfifo(junit)
    assert write_reports(doc, None, str(junit), "run", before) is None
    assert junit.is_file() and junit.read_text().startswith("<?xml")

    # its directory swapped for a link to another one: nothing written in either
    mine_dir, other = tmp_path / "reports", tmp_path / "elsewhere"
    mine_dir.mkdir()
    other.mkdir()
    before = {"--json": seen(mine_dir / "r.json")}
    mine_dir.rename(tmp_path / "moved")
    mine_dir.symlink_to(other)
    assert write_reports(doc, str(mine_dir / "r.json"), None, "run", before) == 2
    assert list(other.iterdir()) == [] and list((tmp_path / "moved").iterdir()) == []

    # a pipe the user gave (`--json >(cat)`, a FIFO with a reader): written into, as before
    mine = tmp_path / "mine.fifo"
    os.mkfifo(mine)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(mine.read_bytes()))
    reader.start()
    assert write_reports(doc, str(mine), None, "run", {"--json": seen(mine)}) is None
    reader.join(10)
    assert mine.is_fifo() and json.loads(got[0]) == doc


# ---- named correctly: one pin each -----------------------------------------------------------------

@pytest.mark.timeout(300)
def test_done_claimed_for_a_step_only_a_refused_helper_attempted_is_named(tmp_path: Path) -> None:
    t = run_trial(tmp_path, "c03", shipped_scenario("c03-delete-release-denied"), AGENT,
                  {"RT48U_MODE": "helper_claim"}, isolation="none")
    _named(t, "FAIL_OUTCOME", "claims completion, but these steps did not succeed: delete_release")


def test_a_claim_in_another_language_claims_nothing_by_the_contract() -> None:
    """Contract section 7: the done words are English; any other text is `not done` (reported: a
    reader of German takes `erledigt` for done, and the trial passes where `not done` is expected)."""
    from vault.runner.claims import claim_of
    for line in ("erledigt: alle Schritte ausgeführt", "完成", "terminé: toutes les étapes"):
        assert claim_of(line) == "not_done", line

