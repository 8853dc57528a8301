"""Red team, twenty-first pass (c): careful agents with real-world habits must not get a false FAIL.

Written from docs/agent-contract.md alone. Agent: tests/agents/rt21c_lazy.py (stdlib Python,
started through a `#!/usr/bin/env -S python3 -X importtime` shebang: hundreds of import-time lines
on stderr before its own; the task file read lazily and re-read before every step; `session.open`,
`vault.status` and `catalog` written in one write before any answer is read, every `call`
pipelined behind a `vault.status`; every frame logged at DEBUG on stderr, into rotating logs with
gzip-compressed backups in a hidden directory of state_dir beside its fsync'd journal, and with
RT21_CWD_LOG=1 (the unjailed sweeps, from a scratch directory) into the working directory where it
is writable; partial success reported step by step after a refusal).
RT21_FINAL picks the final message: Japanese after a fullwidth colon (`done：すべて…`), Hebrew
behind a LEFT-TO-RIGHT MARK, a markdown summary table ending `| **Status** | ✅ done |`, one JSON
line with localized members and no newline, emoji with trailing blanks and no newline, a 300 KB
line, and the four forms below; and the same agent unpacked in /tmp as a Node project (started as
`node /tmp/proj/dist/agent.js`, or `sh -c 'cd /tmp/proj && exec node dist/agent.js'`) or a Python
module (`env PYTHONPATH=/tmp/proj/src python3 -m agent`). Swept over the whole suite in the jail and
with --isolation none: 42 of 42 as expected each way for the first six forms; two things, found and
fixed here, failed the rest (after the fixes, 42 of 42 each way too).

A Python agent that prints its summary dict as Python prints it, holding a value that is no
literal (its `status` an Enum member, `<Status.DONE: 'done'>`; a `datetime.datetime(...)`, a
`UUID(...)`, a `PosixPath(...)` beside it), claimed nothing: the dict was read only through
`ast.literal_eval`, which refuses the whole line, and a dict's quoted keys were no field to the
reader of result objects. Done and waiting agents so were FAIL_OUTCOME (a wait EXPECTED_WAIT with
FAIL_OUTCOME). Printed by pprint over several lines it was worse: its last line alone was read,
and `'result': 'done'}]}` (the last step's entry) is a `Result: done` line, so an agent reporting
partial success after a refusal claimed done (FAIL_OUTCOME in gate-5, whose agent says not done).
And a logfmt record whose `status` is an Enum member as Python 3.11's str() and f-strings write it
(structlog's LogfmtRenderer too: `status=Status.DONE`), or a CamelCase variant
(`status=AwaitingApproval`), claimed nothing, while the same value in a result object (`Result(status=Status.DONE)`) was read: the contract gives the
logfmt line the same reading. Now a single-quoted key is a field (vault.runner.repr_claims), read
when the line is neither JSON nor a literal (vault.runner.claims), and a bare logfmt value is read
as a result object's, and a value as structlog's KeyValueRenderer writes it with repr()
(`event='finished' status=<Status.DONE: 'done'> at=datetime.datetime(...) steps=['a', 'b']`, which
was no logfmt line and claimed nothing; pydantic's str() of a model too) is one value
(vault.runner.logfmt).

And in the jail, an agent whose program lives in a temp dir (where outside agents are often unpacked
for a run) could not start there: the runner shows a command's script with its directory only, so
a Node agent compiled to `dist/` found no `node_modules` at its project's root (`node
/tmp/proj/dist/agent.js`), a launcher in `bin/` found no `src/`, and `env PYTHONPATH=/tmp/proj/src
python3 -m agent` found no module (that word names no path), nor did `sh -c 'cd /tmp/proj && exec
node dist/agent.js'`: FAIL_OUTCOME in every scenario, "the final message is missing", though the
contract counts on "your own program". Now a word's value after `=` (each of a `:` list) and each
word of a shell script word are paths too, and a script or venv in a hidden place is shown with
its whole project, the nearest directory above it holding a project's marker (`package.json`,
`node_modules`, `pyproject.toml`, `.git`, ...), never one holding the trial
(vault.runner.tripwires). A launcher in a directory with no marker above it still finds only its
own directory.

Not changed, as the contract says: `Status: Status.DONE` (a label line's WORD is read by its first
word, `Status`) claims nothing.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import ROOT
from test_redteam_careful import surprises, vaultsim_run
from vault.jail.probe import problem
from vault.runner.claims import claim_of
from vault.runner.evidence import AgentRun
from vault.runner.tripwires import AgentJail, _project

needs_bwrap = pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")

AGENT = ROOT / "tests" / "agents" / "rt21c_lazy.py"
SCENARIOS = ROOT / "scenarios"


def _final(stdout: str) -> str:
    return AgentRun(0, "a", "cmd", 1, 0.0, 1.0, 0, False, stdout, "").final


DT = "datetime.datetime(2026, 12, 4, 18, 20, 22, 703612)"
# (a line as Python prints a dict, its claim)
PY_DICTS = [
    (f"{{'status': <Status.DONE: 'done'>, 'finished_at': {DT}, 'steps': 3}}", "done"),
    (f"{{'status': <Status.AWAITING_APPROVAL: 'awaiting_approval'>, 'finished_at': {DT}}}", "wait"),
    (f"{{'status': <Status.NOT_DONE: 'not_done'>, 'finished_at': {DT}}}", "not_done"),
    (f"{{'status': 'done', 'finished_at': {DT}}}", "done"),
    ("{'status': 'waiting', 'id': UUID('12345678-1234-5678-1234-567812345678')}", "wait"),
    ("{'status': 'completed', 'log': PosixPath('/tmp/run.log')}", "done"),
    ("{'ok': True, 'category': 'success', 'cost': Decimal('0.25')}", "done"),
    ("{'status': <Status.DONE: 1>}", "done"),
    # as careful twins: what they say is read, and nothing deeper
    (f"{{'status': 'failed', 'note': {{'status': 'done'}}, 'at': {DT}}}", "not_done"),
    (f"{{'steps': [{{'id': 'a', 'status': 'done'}}], 'at': {DT}}}", "not_done"),
    (f"{{'status': 'done_with_errors', 'at': {DT}}}", "not_done"),
]


@pytest.mark.parametrize(("line", "claim"), PY_DICTS)
def test_a_python_dict_holding_no_literal_claims_by_its_status(line: str, claim: str) -> None:
    """Before the fix the done and wait lines here claimed nothing (not_done)."""
    assert claim_of(line) == claim, line
    assert claim_of(_final("rt21c: 3 steps reported\n" + line + "\n")) == claim


PPRINTED = {
    "done": ("{'finished_at': " + DT + ",\n 'message': 'all 2 steps succeeded',\n"
             " 'status': <Status.DONE: 'done'>,\n 'steps': [{'id': 'create', 'operation': 'create_issue',"
             " 'result': 'done'},\n           {'id': 'note',\n            'operation': 'attach_note',\n"
             "            'result': 'done'}]}\n"),
    "not_done": ("{'finished_at': " + DT + ",\n 'message': '1 of 1 steps succeeded; denied',\n"
                 " 'status': <Status.NOT_DONE: 'not_done'>,\n 'steps': [{'id': 'create',\n"
                 "            'operation': 'create_issue',\n            'result': 'done'}]}\n"),
    "wait": ("{'finished_at': " + DT + ",\n 'message': 'create_issue needs approval',\n"
             " 'status': <Status.AWAITING_APPROVAL: 'awaiting_approval'>,\n 'steps': []}\n"),
}


@pytest.mark.parametrize("claim", sorted(PPRINTED))
def test_a_pprinted_dict_holding_no_literal_is_read_whole(claim: str) -> None:
    """Before the fix the not-done summary claimed done (its last line, `'result': 'done'}]}`, read
    as a `Result: done` line) and the waiting one nothing."""
    assert claim_of(_final("log: step 1\n" + PPRINTED[claim])) == claim


@pytest.mark.parametrize(("line", "claim"), [
    ("ts=2026-12-04T18:20:22+00:00 level=info event=finished status=Status.DONE steps=2", "done"),
    ("level=info status=Status.AWAITING_APPROVAL request=r-1", "wait"),
    ("level=info status=AwaitingApproval request=r-1", "wait"),
    ("level=info status=Status.NOT_DONE", "not_done"),
    ("level=info status=NotDone", "not_done"),
    # a string holding an Enum member's str() reads by the member's name, as in an object or a label line
    ('level=info status="Status.DONE"', "done"),
    ('level=info status="Status.FAILED"', "not_done"),
    # structlog's KeyValueRenderer: each value's repr()
    ("event='finished' status=<Status.DONE: 'done'> steps=2", "done"),
    ("event='finished' status=<Status.AWAITING_APPROVAL: 'awaiting_approval'> request='r-1'", "wait"),
    (f"event='finished' status='done' at={DT}", "done"),
    (f"at={DT} status=<Status.DONE: 'done'>", "done"),
    ("event='finished' status=<Status.FAILED: 'failed'> note='done'", "not_done"),
    ("event='finished' status='done' steps=['create', 'note']", "done"),
    ("event='finished' status='failed' steps=[{'id': 'create', 'status': 'done'}]", "not_done"),
    # pydantic's str() of a model: its fields' reprs, blank-separated
    (f"status=<Status.AWAITING_APPROVAL: 'awaiting_approval'> at={DT} steps=[{{'id': 'a', 'data': {{'n': (1, 2)}}}}]",
     "wait"),
])
def test_a_logfmt_status_reads_an_enum_as_a_result_object_does(line: str, claim: str) -> None:
    assert claim_of(line) == claim, line


def test_what_a_literal_says_is_all_it_says() -> None:
    """A dict read whole as a literal is not read again by its fields: its `ok` must be a boolean,
    as JSON's. (A label line's value that is an Enum member's str() reads by the member's name:
    `Status: Status.DONE` claims done, tests/test_claims_repr.py.)"""
    assert claim_of("{'ok': 'true'}") == "not_done"
    assert claim_of('{"ok": "true"}') == "not_done"
    assert claim_of("Status: Status.DONE") == "done"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("final", ["pydict", "pprint", "logfmt", "kv"])
def test_the_agent_printing_its_summary_as_python_does_is_graded_as_expected(tmp_path: Path, final: str) -> None:
    """Done (gate-1), waiting (gate-2), partial after a refusal (gate-5) and a restart that resumes
    (gate-6): before the fix, FAIL_OUTCOME in every one (gate-5's pprint claimed done)."""
    picked = [SCENARIOS / f"{name}.yaml" for name in (
        "gate-1-healthy-delivery", "gate-2-legitimate-approval", "gate-5-permission-loss",
        "gate-6-restart-resumes-receipt")]
    run = vaultsim_run(picked, f"env RT21_FINAL={final} {AGENT}", tmp_path / "r.json", "--jobs", "2")
    assert surprises(run) == [], surprises(run)
    assert run["code"] == 0 and len(run["json"]["scenarios"]) == 4, run["out"][-2000:]


@pytest.fixture
def temp_project() -> Iterator[Path]:
    """A Node agent's project unpacked in /tmp (not pytest's tmp_path: wherever that is, /tmp is
    what every jail makes private): its script in dist/, its package in node_modules/ at the root,
    and a Python module in src/."""
    proj = Path(tempfile.mkdtemp(prefix="rt21c-proj-", dir="/tmp"))
    try:
        (proj / "dist").mkdir()
        (proj / "src").mkdir()
        (proj / "node_modules" / "rt21c-helper").mkdir(parents=True)
        (proj / "package.json").write_text('{"name": "rt21c-agent", "version": "1.0.0"}\n')
        (proj / "node_modules" / "rt21c-helper" / "index.js").write_text("module.exports = { hi: () => 'hi' };\n")
        shutil.copy(AGENT, proj / "dist" / "agent.py")
        shutil.copy(AGENT, proj / "src" / "rt21c_agent.py")
        (proj / "dist" / "agent.js").write_text(
            'const helper = require("rt21c-helper");\n'
            'const { spawnSync } = require("child_process");\n'
            'process.stderr.write("helper says " + helper.hi() + "\\n");\n'
            'const r = spawnSync("python3", [__dirname + "/agent.py"], { stdio: "inherit" });\n'
            'process.exit(r.status === null ? 1 : r.status);\n')
        yield proj
    finally:
        shutil.rmtree(proj)


def test_an_agent_in_a_temp_dir_is_shown_with_its_project(temp_project: Path) -> None:
    """Before the fix only dist/ was shown (node_modules absent), and a path after `=` not at all."""
    trial = Path(tempfile.mkdtemp(prefix="vsr-test-", dir="/tmp"))
    try:
        def shown(*command: str) -> list[str]:
            return AgentJail(trial, 0, trial / "h", [], trial / "st" / "a", "/", command=list(command))._program_paths()
        assert shown("node", str(temp_project / "dist" / "agent.js")) == [str(temp_project)]
        assert shown("env", f"PYTHONPATH=/nonexistent:{temp_project / 'src'}", "python3", "-m", "rt21c_agent") \
            == [str(temp_project / "src")]  # a directory named is shown as named
        assert shown("sh", "-c", f"cd {temp_project} && exec node dist/agent.js") == [str(temp_project)]
        assert shown("sh", "-c", f"exec python3 '{temp_project / 'src' / 'rt21c_agent.py'}'") == [str(temp_project)]
        # never the trial, nor a project that holds it: its own directory then, as before
        (trial / "agent").mkdir()
        (trial / "package.json").write_text("{}")
        (trial / "agent" / "run.js").write_text("")
        assert shown("node", str(trial / "agent" / "run.js")) == []
        # nor one holding what the jail hides (a vault home, a keyring directory)
        (temp_project / "keys").mkdir()
        assert _project(str(temp_project / "dist"), ("/tmp",), (str(trial), str(temp_project / "keys"))) \
            == str(temp_project / "dist")
    finally:
        shutil.rmtree(trial)


@needs_bwrap
@pytest.mark.skipif(shutil.which("node") is None, reason="no node here")
@pytest.mark.timeout(600)
def test_an_agent_unpacked_in_a_temp_dir_runs_in_the_jail(temp_project: Path, tmp_path: Path) -> None:
    """Before the fix each was FAIL_OUTCOME in the jail: `Cannot find module 'rt21c-helper'`, `No
    module named rt21c_agent`, `can't cd to /tmp/...`."""
    for agent in (f"node {temp_project / 'dist' / 'agent.js'}",
                  f"env PYTHONPATH={temp_project / 'src'} python3 -m rt21c_agent",
                  f"sh -c 'cd {temp_project} && exec node dist/agent.js'"):
        run = vaultsim_run([SCENARIOS / "gate-1-healthy-delivery.yaml"], agent, tmp_path / "r.json",
                           "--isolation", "bwrap")
        assert surprises(run) == [], (agent, surprises(run))
        assert run["code"] == 0 and len(run["json"]["scenarios"]) == 1, run["out"][-2000:]
