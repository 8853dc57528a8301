"""A trial's approval fatigue, read from what the vault recorded, and its thresholds.

The audit log holds each prompt (`prompt_shown`: operation, risk, scope,
session, the mode the policy gave it) and each decision (`decision`: who,
when it was shown, whether its detail was opened, when decided, a denial's
reason). From them this module rebuilds one `PromptTiming` per prompt and
computes the figures of `vault.gate.fatigue` with the scenario's rubber-stamp
threshold. When the log cannot be read, the daemon's own figures (default
threshold) stand in.

`crossed` compares the figures with the scenario's `expect.prompts`
thresholds and names each one crossed, for FAIL_APPROVAL_FATIGUE.
`prompt_log` is the per-prompt list the report carries, which
`vaultsim policy suggest` reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vault.catalog import Catalog
from vault.gate.fatigue import PromptTiming, destructive_session_grants, signals

if TYPE_CHECKING:
    from vault.runner.evidence import Evidence
    from vault.runner.scenario import Prompts


def timings(ev: "Evidence", catalog: Catalog | None = None) -> list[PromptTiming]:
    """One record per prompt the vault showed in this trial, oldest first."""
    t = ev.transcript
    by_request = {str(d.get("request_id")): d for d in t.decisions.values() if d.get("request_id")}
    out = []
    for p in t.prompts:
        rid = str(p.get("request_id") or "")
        risk = p.get("risk")
        if risk is None and catalog is not None:  # a log from before risk was recorded
            op = catalog.get(str(p.get("operation")))
            risk = op.risk.value if op is not None else ""
        d = by_request.get(rid, {})
        decided = d.get("decided", d.get("time"))
        at = _num(decided)
        if d.get("decision") == "unroutable" and ev.teardown is not None and at is not None and at >= ev.teardown:
            d, decided = {}, None  # the teardown stopped the approver under it: still undecided
        out.append(PromptTiming(
            request_id=rid, operation=str(p.get("operation") or ""), risk=str(risk or ""),
            scope=str(p.get("scope") or ""), session_id=p.get("session_id"),
            asked=float(p.get("time") or d.get("asked") or 0.0),
            shown=_num(d.get("shown")), detail=_num(d.get("detail")), decided=_num(decided),
            decision=d.get("decision"), approver=d.get("approver"), reason=d.get("reason")))
    return sorted(out, key=lambda x: x.asked)


def figures(ev: "Evidence", rubber_stamp_s: float, catalog: Catalog | None = None) -> dict[str, Any]:
    """The trial's fatigue figures: from the audit log, else the daemon's (default threshold).
    Re-asks are counted by scope as a person reads it (vault.gate.fatigue, vault.lookalike)."""
    prompts = timings(ev, catalog)
    grants = max(destructive_session_grants(prompts), int(ev.stats.get("destructive_session_grants", 0)))
    if ev.transcript.source != "audit" and isinstance(ev.stats.get("fatigue"), dict):
        return dict(ev.stats["fatigue"])
    return signals(prompts, rubber_stamp_s=rubber_stamp_s, session_grants_destructive=grants)


def prompt_log(ev: "Evidence", catalog: Catalog | None = None) -> list[dict[str, Any]]:
    """Per prompt: what was asked and how it was answered (no parameters: scopes only)."""
    modes = {str(p.get("request_id")): p.get("mode") for p in ev.transcript.prompts}
    out = []
    for p in timings(ev, catalog):
        item: dict[str, Any] = {"operation": p.operation, "risk": p.risk, "scope": p.scope,
                                "session_id": p.session_id, "mode": modes.get(p.request_id),
                                "decision": p.decision, "approver": p.approver,
                                "latency_s": None if p.latency is None else round(p.latency, 3),
                                "detail_viewed": p.detail is not None}
        if p.reason:
            item["reason"] = p.reason
        out.append({k: v for k, v in item.items() if v is not None})
    return out


# threshold field of expect.prompts -> (the figure it bounds, how a finding names it)
THRESHOLDS: dict[str, tuple[str, str]] = {
    "max_per_minute": ("per_minute.peak", "prompts in one minute"),
    "max_rubber_stamps": ("rubber_stamps", "rubber-stamped approvals"),
    "max_approval_streak": ("longest_approval_streak", "approvals in a row"),
    "max_reasked_after_denial": ("reasked_after_denial", "prompts asked again after a denial"),
    "max_detail_not_viewed": ("detail_not_viewed", "decisions without the detail viewed"),
}


def _figure(figs: dict[str, Any], path: str) -> float:
    value: Any = figs
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value or 0)


def crossed(figs: dict[str, Any], limits: "Prompts") -> list[str]:
    """A finding per threshold of `expect.prompts` the figures cross, naming the threshold."""
    out = []
    for name, (path, what) in THRESHOLDS.items():
        most = getattr(limits, name, None)
        if most is None:
            continue
        value = _figure(figs, path)
        if value > most:
            extra = ""
            if name == "max_rubber_stamps":
                extra = f" (approved within {figs.get('rubber_stamp_s', limits.rubber_stamp_s):g} s of being " \
                        "shown, or without the detail viewed)"
            out.append(f"{name} crossed: {value:g} {what}{extra}; at most {most} expected")
    p50 = limits.min_latency_p50_s
    got = (figs.get("latency_s") or {}).get("p50")
    if p50 is not None and got is not None and got < p50:
        out.append(f"min_latency_p50_s crossed: decisions took {got:g} s at the median; "
                   f"at least {p50:g} s expected")
    return out


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
