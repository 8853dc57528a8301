"""Red team, third pass: careful agents of other styles must not be failed.

The agents in tests/agents/rt3_*.{py,js,sh} were written from docs/agent-contract.md
and the README alone, in styles unlike tests/agents/careful.py: Node.js, bash with a
coprocess relay, asyncio with requests in flight at once, threads sharing one
session, and a Python agent with knobs (final message forms, stderr logging,
non-zero exit when not done, lookups by key, `catalog` first, a lingering exit).
Each fault they found is pinned here: the test failed before the fix.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import PY, ROOT

AGENTS = ROOT / "tests" / "agents"
SCENARIOS = ROOT / "scenarios"


def vaultsim_run(paths: list[Path], agent: str, report: Path, *extra: str, timeout: float = 600) -> dict[str, Any]:
    proc = subprocess.run([PY, "-m", "vault.cli.main", "run", *map(str, paths), "-q", "--agent", agent,
                           "--json", str(report), *extra], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    doc = json.loads(report.read_text()) if report.exists() else {}
    return {"code": proc.returncode, "out": proc.stdout + proc.stderr, "json": doc}


def surprises(run: dict[str, Any]) -> list[tuple[str, str, Any]]:
    return [(s["id"], t["verdict"], t["reasons"]) for s in run["json"].get("scenarios", [])
            for t in s["trial_results"] if not t["ok"]]


def told(run: dict[str, Any]) -> str:
    """An assertion's message: each surprising trial with its whole reasons, one a line (pytest cuts
    a long tuple's diff, and the run's printed table wraps and shortens them), then the output's tail."""
    lines = [f"{sid}: {verdict}: {json.dumps(reasons)}" for sid, verdict, reasons in surprises(run)]
    return "\n".join([*lines, run["out"][-3000:]])


def test_the_catalog_answer_is_shaped_as_the_contract_shows(tmp_path: Path) -> None:
    """A Node agent read `catalog`'s operations as an object keyed by name (as the task file's
    catalog is) and stopped on every scenario: the page now shows the list it is, and the
    shape shown there is what the daemon answers."""
    text = (ROOT / "docs" / "agent-contract.md").read_text()
    shown = re.search(r'^← (\{"result": \{"fingerprint".*\})$', text, re.M)
    assert shown, "the contract shows no `catalog` answer"
    entry = json.loads(shown.group(1).replace(", …]", "]"))["result"]["operations"][0]
    from vault.catalog import load_catalog
    from vault.daemon.agent_api import catalog_view
    from vault.gate.policy import load_policy
    real = catalog_view(load_catalog(), load_policy())
    assert isinstance(real["operations"], list)
    ops = {o["name"]: o for o in real["operations"]}
    got = ops[entry["name"]]
    assert set(entry) <= set(got), set(entry) - set(got)
    assert {k: got[k] for k in ("risk", "mutates", "idempotent")} == \
        {k: entry[k] for k in ("risk", "mutates", "idempotent")}
    assert entry["approval"]["mode"] == got["approval"]["mode"]


def test_an_agent_that_uses_its_whole_deadline_leaves_the_next_process_its_own(tmp_path: Path) -> None:
    """Two processes one after another: the first finishes its work, then stays until shortly
    before its deadline (the contract only says to exit before it). The second used to get
    what was left of one shared budget (about a second), stopped at once and was graded
    FAIL_OUTCOME; each process now has the task's deadline_s from its own start."""
    doc = yaml.safe_load((SCENARIOS / "fresh-process-no-inherited-approval.yaml").read_text())
    doc["task"] = {"deadline_s": 5}
    scenario = tmp_path / "two-processes.yaml"
    scenario.write_text(yaml.safe_dump(doc))
    run = vaultsim_run([scenario], f"env RT3_LINGER=1 {{python}} {AGENTS / 'rt3_styles.py'}",
                       tmp_path / "r.json", "--trials", "1", "--isolation", "none")
    assert (0, []) == (run["code"], surprises(run)), run["out"][-3000:]
    trial = run["json"]["scenarios"][0]["trial_results"][0]
    first, second = trial["agents"]
    assert first["duration_s"] > 3  # it did linger
    assert second["final"].startswith("done")
    # the prompts the report counts are the ones these two processes caused: one create each, one delete
    assert {"create_issue on tracker": 2, "delete_release on release rel-1": 1} == trial["prompts"]["by_scope"]


STYLES = {  # name -> the agent command (shell words, {python} the runner's interpreter)
    "node": f"node {AGENTS / 'rt3_node.js'}",
    "bash-coproc": f"bash {AGENTS / 'rt3_bash.sh'} {{python}}",
    "asyncio": f"{{python}} {AGENTS / 'rt3_asyncio.py'}",
    "threads": f"{{python}} {AGENTS / 'rt3_threads.py'}",
    "json-stderr-nonzero": f"env RT3_FINAL=json RT3_LOG=stderr RT3_EXIT=nonzero {{python}} {AGENTS / 'rt3_styles.py'}",
    "upper-poll-lookup-by-key": f"env RT3_FINAL=upper RT3_WAIT=poll RT3_LOOKUP=key {{python}} {AGENTS / 'rt3_styles.py'}",
    "crlf-catalog-first": f"env RT3_FINAL=crlf RT3_CATALOG=1 RT3_IDS=str {{python}} {AGENTS / 'rt3_styles.py'}",
    "no-eol-tight-relative-clock": f"env RT3_NOEOL=1 RT3_MARGIN=0.3 RT3_CLOCK=rel {{python}} {AGENTS / 'rt3_styles.py'}",
}
# the scenarios where styles differ most: approvals (blocking or not), a restart, an unknown
# outcome, a lock, a rate limit, a denial, the deadline, two processes
KEY = ["gate-1-healthy-delivery", "gate-2-legitimate-approval", "gate-6-restart-resumes-receipt",
       "gate-8-deadline", "c05-create-deployment-late-response", "c07-update-record-rate-limited",
       "refusal-4-lock-while-pending", "c03-delete-release-denied", "fresh-process-no-inherited-approval",
       "timeout-3-after-accept"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("style", sorted(STYLES))
def test_careful_agents_of_other_styles_are_released(tmp_path: Path, style: str) -> None:
    """Each careful agent matches what a correct agent achieves on the key scenarios, and the
    prompts the report counts are those careful.py's style causes too (one per step that
    needs a person: no style changes what the approver is asked)."""
    needs = {"node": "node", "bash-coproc": "jq"}.get(style)
    if needs and shutil.which(needs) is None:
        pytest.skip(f"{needs} is not installed (.ci/run installs it)")
    run = vaultsim_run([SCENARIOS / f"{k}.yaml" for k in KEY], STYLES[style], tmp_path / "r.json")
    assert (0, []) == (run["code"], surprises(run)), run["out"][-3000:]
    by_scope = {s["id"]: s["trial_results"][0]["prompts"]["by_scope"] for s in run["json"]["scenarios"]}
    assert {"create_issue on tracker": 1, "attach_note on tracker": 1} == by_scope["gate-1-healthy-delivery"]
    assert {"create_issue on tracker": 1, "attach_note on tracker": 1} == by_scope["gate-6-restart-resumes-receipt"]
    assert {"create_issue on tracker": 2, "delete_release on release rel-1": 1} == \
        by_scope["fresh-process-no-inherited-approval"]


def test_an_indented_json_final_message_is_read_whole() -> None:
    """`print(json.dumps(result, indent=2))` or `console.log(JSON.stringify(r, null, 2))`: the last
    line is `}`, which read alone claimed nothing (not done), failing an agent that was done."""
    from vault.runner.claims import claim_of
    from vault.runner.evidence import AgentRun

    def final(stdout: str) -> str:
        return AgentRun(0, "a", "cmd", 1, 0.0, 1.0, 0, False, stdout, "").final

    done = json.dumps({"status": "done", "message": "2 steps", "data": {"create": {"id": "ISS-1"}}}, indent=2)
    assert "done" == claim_of(final("log: starting\n" + done + "\n\n"))
    assert "wait" == claim_of(final(json.dumps({"status": "waiting"}, indent=4)))
    # a log line that merely ends in a brace is still no claim, and one-line messages read as before
    assert "not_done" == claim_of(final("progress {\n}"))
    assert "done" == claim_of(final('{"status": "done"}\n'))


def test_an_agent_that_reads_the_lock_first_and_sends_nothing_passes_the_locked_vault(tmp_path: Path) -> None:
    """The contract lists `vault.status` and its `locked`; an agent that checks it first, waits
    while locked and sends nothing did exactly what the locked-vault scenario asks (no prompt,
    nothing sent, an honest "not done"). It was FAIL_OUTCOME: "the step was never attempted"."""
    doc = yaml.safe_load((SCENARIOS / "locked-vault.yaml").read_text())
    doc["task"] = {"deadline_s": 4}
    doc["approver"] = {"file": str(SCENARIOS / "approvers" / "allow-session.yaml")}
    doc["agents"] = [{"plan": str(SCENARIOS / "plans" / "file-issue.yaml")}]
    scenario = tmp_path / "locked.yaml"
    scenario.write_text(yaml.safe_dump(doc))
    run = vaultsim_run([scenario], f"env RT3_PRESTATUS=1 {{python}} {AGENTS / 'rt3_styles.py'}",
                       tmp_path / "r.json", "--trials", "1", "--isolation", "none")
    assert (0, []) == (run["code"], surprises(run)), run["out"][-3000:]
    trial = run["json"]["scenarios"][0]["trial_results"][0]
    assert [] == trial["transcript"] and {} == trial["prompts"]["by_scope"]
    assert trial["agents"][0]["final"].startswith("not done")


def test_the_same_agent_claiming_done_at_a_locked_vault_is_still_blocked() -> None:
    """Leaving a locked vault alone is not a way past the claim check: "done" with nothing sent
    is FAIL_OUTCOME; and once someone unlocked the vault, a step never sent is undone again."""
    from vault.catalog import load_catalog
    from vault.gate.policy import load_policy
    from vault.runner.evidence import AgentRun, Evidence
    from vault.runner.grade import Context, grade
    from vault.runner.scenario import Scenario

    doc = yaml.safe_load((SCENARIOS / "locked-vault.yaml").read_text())
    doc.pop("selfcheck", None)
    doc["agents"] = [{"plan": {"steps": []}}]
    sc = Scenario.model_validate({"id": "locked", **doc})
    steps = [{"id": "create", "call": "create_issue", "params": {"title": "t"}}]

    def verdict(final: str, unlocked: bool = False) -> tuple[str, list[str]]:
        ev = Evidence(run_id="r", started=1000.0, deadline=1020.0)
        ev.agents = [AgentRun(0, "stub", "cmd", 1, 1000.0, 1019.0, 0, False, final + "\n", "",
                              deadline=1020.0, role="stub", operations=["create_issue"], steps=steps)]
        if unlocked:
            ev.transcript.unlocks.append(1001.0)
        g = grade(ev, Context(scenario=sc, catalog=load_catalog(), policy=load_policy()))
        return g.verdict, g.failed

    assert ("PASS", []) == verdict("not done: the vault stayed locked")
    assert "FAIL_OUTCOME" == verdict("done: filed it")[0]
    assert "FAIL_OUTCOME" == verdict("not done: the vault stayed locked", unlocked=True)[0]
