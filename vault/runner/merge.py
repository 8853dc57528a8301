"""`vaultsim report merge A.json B.json ... [--json F] [--junit F]`: shards into one release decision.

A CI matrix runs `vaultsim run --shard K/N --json shard-K.json` on N
machines; a last job merges the N reports and decides the release with the
same exit codes as `vaultsim run` (0 release OK, 1 blocked, 3 a harness
error, 5 nothing ran), printing the same gate table and writing the same
JSON and JUnit a single run would have: each case's trials are joined and
its figures recomputed by the code `run` uses (vault.runner.report), so the
merged report equals one run's, timings aside (`wall_time_s` is the slowest
shard's, the matrix's wall time). `run.merged_shards` lists what was joined.

Refused as bad input (exit 2), naming the file: not a report, a report of
another schema version, a report that is not a shard (`run.shard`), shards
of different selections or counts, a shard given twice or missing, and a
trial that two shards both claim. A missing shard is never merged into a
"release OK": its trials would simply be absent.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from vault.catalog import read_regular_text
from vault.cli.main import path_arg
from vault.errors import BadInput
from vault.runner import table as out
from vault.runner.outputs import write_reports
from vault.runner.report import scenario_entry, summarize
from vault.runner.report_schema import EXIT_FOR, MAX_REPORT_BYTES, Report

COMPUTED = ("failed_checks", "trials", "verdicts", "ok", "response_only_false_pass", "prompts_by_scope", "time_s",
            "trial_results")


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    m = sub.add_parser("merge", help="join shard reports (`vaultsim run --shard K/N --json F`) into one decision",
                       description="Join the JSON reports of `vaultsim run --shard K/N` into one report and "
                                   "decide the release (exit 0 OK, 1 blocked, 2 bad input, 3 harness error, "
                                   "5 nothing ran).")
    m.add_argument("reports", nargs="+", metavar="REPORT", type=path_arg, help="every shard's --json report")
    m.add_argument("--json", metavar="FILE", type=path_arg, help="write the merged report as JSON")
    m.add_argument("--junit", metavar="FILE", type=path_arg, help="write the merged report as JUnit XML")
    m.add_argument("--color", choices=("auto", "always", "never"), default="auto")


def run(args: argparse.Namespace) -> int:
    from vault.cli.run import _check_output
    for option, path in (("--json", args.json), ("--junit", args.junit)):
        if path:
            _check_output(option, Path(path))
    doc = merge([load(Path(p)) for p in args.reports])
    console = out.make_console(args.color)
    out.render(doc, console)
    failed = write_reports(doc, args.json, args.junit, "report merge")
    return failed if failed is not None else EXIT_FOR[doc["summary"]["release"]]


def load(path: Path) -> tuple[str, dict[str, Any]]:
    """(name, document) of one shard report, checked against the report schema."""
    try:
        doc = json.loads(read_regular_text(path, MAX_REPORT_BYTES, "a JSON report"))
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror}") from None
    except ValueError as exc:
        raise BadInput(f"{path}: not JSON ({exc})") from None
    except RecursionError:  # nested past the parser's depth: no report is
        raise BadInput(f"{path}: not JSON (nested too deeply to read)") from None
    try:
        Report.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(top)"
        raise BadInput(f"{path}: not a vaultsim run report: field {where}: {err['msg']}") from None
    if not isinstance(doc["run"].get("shard"), dict):
        raise BadInput(f"{path}: not a shard report (it has no run.shard; run with --shard K/N)")
    return str(path), doc


def merge(shards: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One report from every shard's report (see the module docstring for what is refused)."""
    first_name, first = shards[0]
    spec = first["run"]["shard"]
    by_index: dict[int, str] = {}
    for name, doc in shards:
        s = doc["run"]["shard"]
        if (s.get("count"), s.get("selection")) != (spec.get("count"), spec.get("selection")):
            raise BadInput(f"{name}: shard {s.get('index')}/{s.get('count')} of selection {s.get('selection')} "
                           f"does not belong with {first_name} (shard {spec.get('index')}/{spec.get('count')} "
                           f"of selection {spec.get('selection')}): same paths, -k, --trials and --selfcheck "
                           "on every shard")
        if s.get("index") in by_index:
            raise BadInput(f"{name}: shard {s.get('index')}/{s.get('count')} is also {by_index[s['index']]}")
        by_index[s.get("index")] = name
    missing = [k for k in range(1, int(spec.get("count", 0)) + 1) if k not in by_index]
    if missing:
        raise BadInput("missing " + ", ".join(f"shard {k}/{spec.get('count')}" for k in missing)
                       + ": no release decision without every shard's trials")
    shards = sorted(shards, key=lambda s: s[1]["run"]["shard"]["index"])
    heads: dict[str, dict[str, Any]] = {}
    trials: dict[str, list[dict[str, Any]]] = {}
    owner: dict[tuple[str, int], str] = {}
    for name, doc in shards:
        for sc in doc["scenarios"]:
            heads.setdefault(sc["id"], {k: v for k, v in sc.items() if k not in COMPUTED})
            for t in sc.get("trial_results", []):
                key = (sc["id"], t.get("trial"))
                if key in owner:
                    raise BadInput(f"{name}: trial {key[1]} of {key[0]} is also in {owner[key]}")
                owner[key] = name
                trials.setdefault(sc["id"], []).append(t)
    entries = [scenario_entry(head, trials.get(sid, [])) for sid, head in heads.items()]
    run = dict(first["run"])
    not_run = sum(int(doc["run"].get("not_run") or 0) for _, doc in shards)
    expected_total = int(spec.get("selected_trials", 0))
    if len(owner) + not_run != expected_total:
        raise BadInput(f"the shards hold {len(owner)} trials ({not_run} not run) of the {expected_total} selected")
    run.update(shard=None, merged_shards=[f"{doc['run']['shard']['index']}/{spec['count']}" for _, doc in shards],
               stopped_early=any(doc["run"].get("stopped_early") for _, doc in shards), not_run=not_run)
    wall = max(float(doc["summary"].get("wall_time_s") or 0) for _, doc in shards)
    return {**first, "run": run, "summary": summarize(entries, wall), "scenarios": entries}
