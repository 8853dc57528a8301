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

from .. import __version__

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
    isolation: str | None = Field(default=None, description="how the agent was isolated, when recorded")
    effects: dict[str, int] = Field(default_factory=dict, description="committed remote effects per operation")
    attempts: dict[str, int] = Field(default_factory=dict, description="requests per operation")
    prompts: dict[str, Any] = Field(default_factory=dict, description="approval prompts: total, by_scope, ...")
    node: dict[str, str] | None = Field(default=None, description="--executor ray: the node it ran on "
                                        "(`id`, Ray's node id; `host`)")
    retried: dict[str, Any] | None = Field(default=None, description="--executor ray: run again once because "
                                           "its worker or node died (`attempts`, `because`)")


class ScenarioEntry(BaseModel):
    model_config = _Open
    id: str = Field(description="the case: the scenario id, or `id[variant]` for a self-check")
    scenario: str | None = Field(default=None, description="the scenario file's id")
    selfcheck: str | None = Field(default=None, description="the agent_stub variant of a self-check, else null")
    also: list[str] = Field(default_factory=list, description="checks the expectation allows to fail too")
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
    isolation: str | None = Field(default=None, description="--isolation when given; per trial in trial_results")
    trials: int | None = Field(default=None, description="--trials N; null: each scenario's own count")
    jobs: int
    paths: list[str]
    pattern: str | None = None
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


def write_atomic(path: Path, text: str) -> None:
    """Write the whole file or nothing: a reader never sees half a report."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.resolve().parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # what a plain open() would have made
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: Path, doc: dict[str, Any]) -> None:
    if path.is_char_device() or path.is_fifo():  # /dev/stdout, a pipe: no rename possible
        path.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
        return
    write_atomic(path, json.dumps(doc, indent=2, default=str) + "\n")
