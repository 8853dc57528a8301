"""`vaultsim schema report|scenario|policy|catalog|result`: JSON Schemas of the files vaultsim reads and writes.

Each is generated from the pydantic model that reads or writes that file, so
it cannot drift from what vaultsim accepts: a scenario, a policy and a
catalog for authors (editors validate YAML against JSON Schema), the run's
JSON report for CI readers, the Result for agent authors.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _report() -> dict[str, Any]:
    from vault.runner.report_schema import report_schema
    return report_schema()


def _scenario() -> dict[str, Any]:
    from vault.runner.scenario import Scenario
    schema = Scenario.model_json_schema()
    schema["properties"].pop("path", None)  # set by the loader, never written in a file
    return schema


def _policy() -> dict[str, Any]:
    from vault.gate.policy import Policy
    return Policy.model_json_schema()


def _catalog() -> dict[str, Any]:
    from vault.catalog import Catalog
    schema = Catalog.model_json_schema()
    # an operation's name is its key in the mapping, not a field written in the file
    schema.get("$defs", {}).get("Operation", {}).get("properties", {}).pop("name", None)
    return schema


def _result() -> dict[str, Any]:
    from vault.models import result_schema
    return result_schema()


SCHEMAS: dict[str, Callable[[], dict[str, Any]]] = {
    "report": _report, "scenario": _scenario, "policy": _policy, "catalog": _catalog, "result": _result,
}


def schema(which: str) -> dict[str, Any]:
    return {"$schema": DRAFT, **SCHEMAS[which]()}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("which", choices=list(SCHEMAS),
                   help="report: `run --json`; scenario, policy, catalog: the YAML files; result: what agents get")


def run(args: argparse.Namespace) -> int:
    print(json.dumps(schema(args.which), indent=2, sort_keys=True))
    return 0
