"""The JSON report of `vaultsim run --json`: its models, its schema, its version.

CI jobs and dashboards read this file, so its shape is a contract: the
pydantic models below are the schema (`vaultsim schema report`), the report
carries `schema_version`, and a test validates real reports against it.
Within one schema version fields may be added (every object allows extra
keys, so a reader must ignore what it does not know); renaming, removing or
changing the meaning of a field bumps the version.

    {"schema_version": 1, "vaultsim_version": "0.1.0",
     "run": {"agent": ..., "isolation": ..., "trials": ..., ...},
     "summary": {"release": "ok" | "blocked" | "error" | "nothing_ran", ...},
     "verdict_order": [...],
     "scenarios": [{"id": ..., "file": ..., "trial_results": [{"trial": 1, "verdict": ...}]}]}

`summary.release` decides the exit code (`EXIT_FOR`): ok 0, blocked 1 (a
trial's verdict differs from its scenario's expectation), error 3 (a trial's
harness failed, so no decision), nothing_ran 5 (every selected scenario was
skipped). Written all-or-nothing (temp file, then rename).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vault import __version__
from vault.audit.files import fsync_dir

SCHEMA_VERSION = 1
Release = Literal["ok", "blocked", "error", "nothing_ran"]
EXIT_FOR: dict[str, int] = {"ok": 0, "blocked": 1, "error": 3, "nothing_ran": 5}

_Open = ConfigDict(extra="allow")  # see the module docstring: readers ignore what they do not know


class TrialEntry(BaseModel):
    """One trial: its verdict, the expectation, and the evidence behind it."""

    model_config = _Open
    trial: int = Field(ge=1)
    verdict: str = Field(description="a verdict of verdict_order, or ERROR (harness failed) or SKIPPED")
    expected: str
    ok: bool = Field(description="the verdict is the expected one (a skipped trial counts as ok)")
    duration_s: float = Field(ge=0)
    reasons: list[str] = Field(default_factory=list, description="why the grader decided so")
    failed: list[str] = Field(default_factory=list,
                              description="every check that failed, in verdict order (the headline first)")
    unexpected: list[str] = Field(default_factory=list,
                                  description="checks that failed beyond what the expectation names")
    findings: dict[str, list[str]] = Field(default_factory=dict, description="per failed check, its findings")
    error: str | None = Field(default=None, description="ERROR: what failed; SKIPPED: why")
    missed: str | None = Field(default=None, description="a trial whose expected (non-PASS) verdict did not "
                               "come although that check found nothing: what the check saw (added in 0.1)")
    isolation: str | None = Field(default=None, description="how the agents were isolated: bwrap (each in "
                                  "its own jail) or none (unjailed; a bypass is detected and graded)")
    network: str | None = Field(default=None, description="the agents' network: none (a jail without one) "
                                "or host (--agent-network host, or no jail)")
    effects: dict[str, int] = Field(default_factory=dict, description="committed remote effects per operation")
    attempts: dict[str, int] = Field(default_factory=dict, description="requests per operation")
    prompts: "TrialPrompts" = Field(default_factory=lambda: TrialPrompts(),
                                    description="approval prompts: total, by_scope, ..., fatigue, asked")
    node: dict[str, str] | None = Field(default=None, description="--executor ray: the node it ran on "
                                        "(`id`, Ray's node id; `host`)")
    retried: dict[str, Any] | None = Field(default=None, description="--executor ray: run again once because "
                                           "its worker or node died (`attempts`, `because`)")


class LatencyFigures(BaseModel):
    model_config = _Open
    count: int = Field(ge=0, description="decisions timed")
    p50: float | None = Field(description="median seconds from shown to decided")
    p90: float | None = Field(description="90th percentile, seconds")


class PerMinute(BaseModel):
    model_config = _Open
    peak: int = Field(ge=0, description="most prompts asked within any 60 s")
    mean: float = Field(ge=0, description="prompts per minute between the first and the last (at least 1 min)")


class ApproverFatigue(BaseModel):
    """The fatigue figures over the prompts one approver decided."""

    model_config = _Open
    prompts: int = Field(ge=0)
    per_minute: PerMinute
    latency_s: LatencyFigures
    rubber_stamps: int = Field(ge=0, description="approvals within rubber_stamp_s of being shown, or without "
                                                 "the detail viewed")
    detail_not_viewed: int = Field(ge=0, description="decisions taken without the detail opened")
    longest_approval_streak: int = Field(ge=0, description="most approvals in a row, in decision order")
    reasked_after_denial: int = Field(ge=0, description="prompts for a scope already denied in the run")
    read_prompts: int = Field(ge=0, description="prompts for read operations")
    denied_with_reason: int = Field(default=0, ge=0, description="denials that carried a reason")


class FatigueFigures(ApproverFatigue):
    """`trial_results[].prompts.fatigue` (added in 0.1, schema 1): how the prompts weighed on the
    person (vault.gate.fatigue)."""

    rubber_stamp_s: float = Field(description="the rubber-stamp threshold used (expect.prompts.rubber_stamp_s)")
    session_grants_destructive: int = Field(ge=0, description="session grants covering a destructive risk class")
    by_approver: dict[str, ApproverFatigue] = Field(default_factory=dict)


class PromptAsked(BaseModel):
    """`trial_results[].prompts.asked[]`: one prompt, what `vaultsim policy suggest` reads."""

    model_config = _Open
    operation: str
    risk: str
    scope: str
    session_id: str | None = None
    mode: str | None = Field(default=None, description="the policy mode it was asked under")
    decision: str | None = Field(default=None, description="allow_once, allow_session, deny, expired, "
                                                           "unroutable, locked, withdrawn; absent: undecided")
    approver: str | None = None
    latency_s: float | None = None
    detail_viewed: bool = False
    reason: str | None = Field(default=None, description="a denial's reason, as the agent received it")


class TrialPrompts(BaseModel):
    """`trial_results[].prompts`: the gate's counts for the trial; `fatigue` and `asked` were added
    within schema 1 (older reports lack them)."""

    model_config = _Open
    total: int = Field(default=0, ge=0)
    by_scope: dict[str, int] = Field(default_factory=dict)
    fatigue: FatigueFigures | None = None
    asked: list[PromptAsked] = Field(default_factory=list)


TrialEntry.model_rebuild()


class ScenarioEntry(BaseModel):
    model_config = _Open
    id: str = Field(description="the case: the scenario id, or `id[variant]` for a self-check")
    scenario: str | None = Field(default=None, description="the scenario file's id")
    selfcheck: str | None = Field(default=None, description="the agent_stub variant of a self-check, else null")
    also: list[str] = Field(default_factory=list, description="checks the expectation allows to fail too")
    policy: str | None = Field(default=None, description="the policy file the scenario ran under; null: the "
                                                         "default policy")
    failed_checks: dict[str, int] = Field(default_factory=dict,
                                          description="how many trials failed each check (headline or not)")
    title: str
    file: str
    tags: list[str]
    expected: str
    trials: int = Field(ge=0)
    verdicts: dict[str, int] = Field(description="how many trials got each verdict (a distribution)")
    ok: bool
    response_only_false_pass: int = Field(ge=0)
    prompts_by_scope: dict[str, list[int]] = Field(description="per scope, the prompt count of every trial")
    time_s: float = Field(ge=0)
    trial_results: list[TrialEntry]


class Summary(BaseModel):
    model_config = _Open
    release: Release
    blocked_by: list[str] = Field(description="scenarios with a trial whose verdict was not the expected one")
    errors: list[str] = Field(default_factory=list, description="scenarios with a trial whose harness failed")
    scenarios: int
    trials: int
    verdicts: dict[str, int]
    response_only_false_pass: int
    skipped: list[str] = Field(description="scenarios not run at all")
    skip_reasons: dict[str, str] = Field(default_factory=dict, description="scenario id -> why it was skipped")
    wall_time_s: float


class RunInfo(BaseModel):
    """What was put under test and how: the header of the run."""

    model_config = _Open
    agent: str = Field(description="the agent under test, as a person would name it")
    agent_command: list[str] | None = Field(default=None, description="--agent CMD, split; null: each scenario's own")
    isolation: str | None = Field(default=None, description="--isolation as resolved (bwrap or none; auto "
                                  "under --list); per trial in trial_results")
    agent_network: str | None = Field(default=None, description="a jailed agent's network (--agent-network); "
                                      "host without a jail")
    isolation_note: str | None = Field(default=None, description="why the agents run without a jail, when "
                                       "they do (--isolation none, or auto on a machine that cannot jail)")
    trials: int | None = Field(default=None, description="--trials N; null: each scenario's own count")
    jobs: int
    paths: list[str]
    pattern: str | None = None
    policy: str | None = Field(default=None, description="--policy FILE: the policy of scenarios naming none")
    executor: str = Field(default="local", description="where trials ran: local or ray")
    shard: dict[str, Any] | None = Field(default=None, description="--shard K/N: `index`, `count`, "
                                         "`selected_trials` (of the whole selection) and `selection` (its digest)")
    merged_shards: list[str] | None = Field(default=None, description="`vaultsim report merge`: the shards "
                                            "joined, as K/N")
    ray: dict[str, Any] | None = Field(default=None, description="--executor ray: `address`, the live "
                                       "`nodes` (id, host, resources) and `trial_resources`")
    stopped_early: bool = Field(default=False, description="-x stopped the run at the first unexpected verdict")
    not_run: int = Field(default=0, description="trials not run because of -x or an interrupt")


class Report(BaseModel):
    """The whole `vaultsim run --json` document."""

    model_config = ConfigDict(extra="allow", title="vaultsim run report")
    schema_version: Literal[1]
    vaultsim_version: str
    run: RunInfo
    summary: Summary
    verdict_order: list[str]
    scenarios: list[ScenarioEntry]


def report_schema() -> dict[str, Any]:
    schema = Report.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def document(run: dict[str, Any], summary: dict[str, Any], verdict_order: list[str],
             scenarios: list[dict[str, Any]]) -> dict[str, Any]:
    """The report document (plain JSON types), versioned."""
    return {"schema_version": SCHEMA_VERSION, "vaultsim_version": __version__, "run": run,
            "summary": summary, "verdict_order": verdict_order, "scenarios": scenarios}


# a run report is read whole; far past any real run's (10,000 trials with transcripts: ~100 MiB)
MAX_REPORT_BYTES = 1 << 30


def write_atomic(path: Path, text: str) -> None:
    """Write the whole file or nothing: a reader never sees half a report. The temp file goes
    beside the path's own entry, which the rename replaces (a link there is replaced, not followed:
    one to /dev/null or another disk made the rename fail across devices)."""
    where = Path(os.path.abspath(path)).parent
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=where)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: after a power cut, the old file or the new
        os.chmod(tmp, 0o666 & ~_umask())  # what a plain open() would have made
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(where)  # the rename itself (best effort: the file is whole either way)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: Path, doc: dict[str, Any], through: bool | None = None) -> None:
    """`through`: write into what is there (a pipe, a device) instead of replacing it; by default
    when it is one (vault.runner.outputs decides it from what was there before the run)."""
    if through if through is not None else (path.is_char_device() or path.is_fifo()):  # /dev/stdout, a pipe
        path.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
        return
    write_atomic(path, json.dumps(doc, indent=2, default=str) + "\n")
