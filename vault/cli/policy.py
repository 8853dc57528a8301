"""`vaultsim policy suggest REPORT.json… [--max-risk R] [--policy BASE] [-o FILE]`: a policy that asks less.

Reads the prompts of one or more run reports (`trial_results[].prompts.asked`)
and proposes the smallest change to the base policy (default: the shipped
default policy) that would have cut them, one operation at a time:

    per_call -> session   an operation asked again for the same scope in the
                          same session, every time approved: one session
                          approval would have covered the rest
    -> auto               an operation whose risk class is at most
                          `--max-risk` (default `read`) that was approved every
                          time it was asked, when session mode would save
                          nothing

Never for `delete`, `execute`, `spend`, `permission` or `credential`
operations, whatever `--max-risk` says, and never for an operation that was
denied, expired or went unanswered even once: that prompt did its job.
Only prompts asked under the base policy count: the trials of scenarios that
name no policy of their own (or name BASE). The savings assume the approver
answers `allow_session` whenever it is offered.

The suggested policy is BASE with the changed operations added under
`operations:`; prove it with `vaultsim run --policy suggested.yaml` (the
policy of every scenario that names none), which should show fewer prompts
and the same verdicts. Exit 0 with a suggestion, 1 with nothing to suggest,
2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from vault.catalog import (DESTRUCTIVE, Catalog, Risk, format_validation_error, load_catalog, load_yaml_model,
                           read_regular_text)
from vault.cli.main import path_arg
from vault.errors import BadInput
from vault.gate.policy import Mode, Policy, RuleSpec, load_policy
from vault.resources import DEFAULT_POLICY
from vault.runner.report_schema import MAX_REPORT_BYTES, Report, write_atomic
from vault.text import plural, printable

APPROVED = frozenset({"allow_once", "allow_session"})
# how far `--max-risk` may reach: only the harmless classes, in order
LOOSENABLE = (Risk.read, Risk.create, Risk.update)


@dataclass
class Asked:
    """One prompt of the reports: where it was asked and how it was answered."""

    run: str  # "case id #trial"
    operation: str
    risk: str
    scope: str
    session: str
    decision: str | None


@dataclass
class Change:
    operation: str
    risk: str
    before: str
    after: str
    why: str
    saved: Counter[str] = field(default_factory=Counter)  # per run

    @property
    def total(self) -> int:
        return sum(self.saved.values())


def load_reports(paths: list[str]) -> list[dict[str, Any]]:
    docs = []
    for raw in paths:
        path = Path(raw)
        try:
            doc = json.loads(read_regular_text(path, MAX_REPORT_BYTES, "a JSON report"))
            Report.model_validate(doc)
        except OSError as exc:
            raise BadInput(f"{raw}: cannot read the report: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise BadInput(f"{raw}: not a JSON report (line {exc.lineno}: {exc.msg})") from None
        except UnicodeDecodeError:
            raise BadInput(f"{raw}: not a JSON report (not UTF-8 text)") from None
        except ValidationError as exc:
            raise BadInput(f"{raw}: not a vaultsim run report: {format_validation_error(exc)}") from None
        except (ValueError, RecursionError):  # an integer longer than Python converts, nesting past the parser's
            raise BadInput(f"{raw}: not a JSON report (holds a value too large or too deeply nested to read)") from None
        docs.append(doc)
    return docs


def prompts_of(docs: list[dict[str, Any]], base: Path | None) -> tuple[list[Asked], int, int]:
    """(prompts asked under the base policy, trials read, trials skipped for another policy)."""
    base_path = str(base.resolve()) if base is not None else None
    out, used, other = [], 0, 0
    for doc in docs:
        for sc in doc.get("scenarios", []):
            policy = sc.get("policy")
            if sc.get("selfcheck") or (policy is not None and policy != base_path):
                other += len(sc.get("trial_results") or [])
                continue
            for t in sc.get("trial_results") or []:
                used += 1
                for p in (t.get("prompts") or {}).get("asked") or []:
                    out.append(Asked(f"{sc.get('id')} #{t.get('trial')}", str(p.get("operation")),
                                     str(p.get("risk")), str(p.get("scope")), str(p.get("session_id")),
                                     p.get("decision")))
    return out, used, other


def suggest(asked: list[Asked], policy: Policy, catalog: Catalog, max_risk: Risk) -> tuple[list[Change], list[str]]:
    """(the changes, what was left alone and why)."""
    reach = set(LOOSENABLE[: LOOSENABLE.index(max_risk) + 1])
    by_op: dict[str, list[Asked]] = defaultdict(list)
    for a in asked:
        by_op[a.operation].append(a)
    changes, kept = [], []
    for name, items in sorted(by_op.items()):
        op = catalog.get(name)
        risk = Risk(op.risk) if op is not None else _risk(items[0].risk)
        if risk is None or risk in DESTRUCTIVE:
            kept.append(f"{name}: {items[0].risk} operations are never loosened")
            continue
        refused = Counter(a.decision or "undecided" for a in items if a.decision not in APPROVED)
        if refused:
            kept.append(f"{name}: not every prompt was approved ({', '.join(f'{k} {v}' for k, v in sorted(refused.items()))})")
            continue
        mode = policy.rule_for(op).mode if op is not None else Mode.per_call
        if mode in (Mode.auto, Mode.deny):
            continue
        repeats: Counter[str] = Counter()
        first: set[tuple[str, str, str]] = set()
        for a in items:
            key = (a.run, a.session, a.scope)
            if key in first:
                repeats[a.run] += 1
            first.add(key)
        if mode is Mode.per_call and repeats:
            changes.append(Change(name, risk.value, mode.value, Mode.session.value,
                                  "asked again for the same scope in the same session, always approved", repeats))
        elif risk in reach:
            every: Counter[str] = Counter(a.run for a in items)
            changes.append(Change(name, risk.value, mode.value, Mode.auto.value,
                                  f"{_a(risk.value)} operation approved every time it was asked", every))
        else:
            kept.append(f"{name}: {_a(risk.value)} operation; --max-risk {max_risk.value} keeps it asking")
    return sorted(changes, key=lambda c: (-c.total, c.operation)), kept


def _risk(value: str) -> Risk | None:
    try:
        return Risk(value)
    except ValueError:
        return None


def suggested_policy(base_file: Path, changes: list[Change]) -> str:
    """BASE with each change as an operation rule, as YAML a person can read."""
    doc = yaml.safe_load(base_file.read_text(encoding="utf-8")) or {}
    ops = doc.setdefault("operations", {}) or {}
    for c in changes:
        ops[c.operation] = {**(ops.get(c.operation) or {}), "mode": c.after}
    doc["operations"] = ops
    text = yaml.safe_dump(doc, sort_keys=False)
    Policy.model_validate(yaml.safe_load(text))  # what we write loads
    head = [f"# Suggested by `vaultsim policy suggest` from {base_file.name}: "
            f"{plural(sum(c.total for c in changes), 'prompt')} fewer in the reports read."]
    head += [f"#   {c.operation}: {c.before} -> {c.after} ({c.why}; saves {c.total})" for c in changes]
    return "\n".join(head) + "\n" + text


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = sub.add_parser("suggest", help="propose the smallest policy change that would have asked less")
    s.add_argument("reports", nargs="+", metavar="RUN_REPORT.json", type=path_arg, help="`vaultsim run --json` reports")
    s.add_argument("--max-risk", choices=[r.value for r in LOOSENABLE], default=Risk.read.value,
                   help="the highest risk class that may become `auto` (default read; destructive classes "
                        "are never loosened)")
    s.add_argument("--policy", metavar="BASE", type=path_arg, help="the policy to change (default: the shipped default)")
    s.add_argument("--catalog", metavar="FILE", type=path_arg, help="the operation catalog (default: the shipped one)")
    s.add_argument("-o", "--output", metavar="FILE", type=path_arg, help="write the suggested policy here (default: stdout)")
    s.add_argument("--json", action="store_true", help="print the changes and savings as JSON")


def run(args: argparse.Namespace) -> int:
    base = Path(args.policy) if args.policy else None
    if base is not None and not base.is_file():
        raise BadInput(f"--policy: {base} is not a regular file" if base.exists()
                       else f"--policy: no such file {base}")
    policy = load_policy(base) if base is not None else load_policy()
    base_file = base if base is not None else Path(str(DEFAULT_POLICY))
    catalog = load_yaml_model(args.catalog, Catalog) if args.catalog else load_catalog()
    docs = load_reports(args.reports)
    asked, used, other = prompts_of(docs, base)
    changes, kept = suggest(asked, policy, catalog, Risk(args.max_risk))
    runs = sorted({a.run for a in asked})
    before = Counter(a.run for a in asked)
    text = suggested_policy(base_file, changes) if changes else None
    if text is not None and args.output:  # before anything is printed: a failed write is the only output
        try:
            write_atomic(Path(args.output), text)
        except OSError as exc:
            raise BadInput(f"--output: cannot write {args.output}: {exc.strerror}") from None
    if args.json:
        print(json.dumps({"changes": [{"operation": c.operation, "risk": c.risk, "from": c.before, "to": c.after,
                                       "why": c.why, "saved": c.total, "saved_per_run": dict(c.saved)}
                                      for c in changes],
                          "kept": kept, "prompts_per_run": {r: {"before": before[r],
                                                                "after": before[r] - sum(c.saved[r] for c in changes)}
                                                            for r in runs},
                          "trials_read": used, "trials_under_other_policies": other}, indent=2))
    else:
        print(f"read {plural(used, 'trial')} ({plural(len(asked), 'prompt')}) under {base_file.name}"
              + (f"; {plural(other, 'trial')} under their own policies left out" if other else ""),
              file=sys.stderr)
        for c in changes:
            print(f"{c.operation} ({c.risk}): {c.before} -> {c.after}: {c.why}; saves {plural(c.total, 'prompt')}",
                  file=sys.stderr)
        for k in kept:
            print(f"kept: {printable(k)}", file=sys.stderr)
        for r in runs:
            saved = sum(c.saved[r] for c in changes)
            if saved:
                print(f"  {printable(r)}: {before[r]} -> {plural(before[r] - saved, 'prompt')} (saves {saved})",
                      file=sys.stderr)
    if text is None:
        if not args.json:
            print("nothing to suggest: no prompt could have been saved without loosening what must ask",
                  file=sys.stderr)
        return 1
    if not args.output and not args.json:
        sys.stdout.write(text)
    return 0


def _a(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"
