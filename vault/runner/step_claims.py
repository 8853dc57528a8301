"""A `done` claim some of whose steps no success of their own covers (FAIL_OUTCOME).

Why: a step is an operation *with its parameters*, done once (docs/agent-contract.md, section 2),
and `done` claims that every step succeeded (section 7). The claim check (vault.runner.claims)
counts a process's successes per operation, so two lies passed: a note attached to an issue the
task never named (a seeded `ISS-1` instead of `${create.id}`; the effect was named, the claim was
not), and, of two reads of one operation (`b-101`, `b-102`), the first read twice and the second
never. Here each success is matched to one step whose parameters it fits, as offtask reads what
was sent (the prompt, the path, the body or query the remote got); a call with nothing to compare
(an SSH command) fits every step of its operation. Only operations the claim check found complete
by count are looked at, so a step missing altogether is named once, there.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from vault.catalog import Catalog
from vault.runner.claims import claim_of, read_as
from vault.runner.evidence import Evidence
from vault.runner.offtask import (_BODY_METHODS, _body_fits, _created, _nothing, _path_fits,
                                  _prompt_fits, _query_fits, _route_fits, _shown)
from urllib.parse import parse_qsl


def step_fits(ev: Evidence, catalog: Catalog) -> dict[str, set[int]]:
    """Per correlation id with something to compare: the indices (in its agent's `steps`) of the
    steps of its operation whose parameters every record of what it sent fits."""
    by_cid = {e.correlation_id: e.agent_index for e in ev.transcript.entries if e.correlation_id}
    op_by_cid: dict[str, str] = {}
    for x in ev.transcript.entries:
        op_by_cid.setdefault(x.correlation_id, x.operation)
    created_by = _created(ev, by_cid)
    out: dict[str, set[int]] = {}

    def narrow(cid: str, fits: Callable[[Any, dict[str, Any], dict[str, set[str]]], bool]) -> None:
        agent = ev.agent(by_cid.get(cid))
        op = catalog.get(op_by_cid.get(cid, ""))
        if agent is None or op is None or not agent.steps:
            return
        created = created_by.get(agent.name, _nothing())
        mine = {i for i, s in enumerate(agent.steps) if s.get("call") == op.name}
        fit = {i for i in mine if fits(op, agent.steps[i], created)}
        out[cid] = out.get(cid, mine) & fit

    for note in ev.prompts_asked:
        params = note.get("params")
        if isinstance(params, dict) and str(note.get("operation")) == op_by_cid.get(str(note.get("correlation_id"))):
            narrow(str(note.get("correlation_id")), lambda op, s, c, p=params: _prompt_fits(op, s, p, c))
    for e in ev.remote_events:
        cid, sent = str(e.get("correlation_id") or ""), str(e.get("sent_path") or e.get("path") or "")
        if (e.get("event") == "received" and e.get("via") is not False and cid and sent
                and e.get("route") != "operation_status"):
            narrow(cid, lambda op, s, c, p=sent: op.executor != "http" or not op.path or _path_fits(op, s, p, c))
    for r in ev.requests_sent:
        cid = str(r.get("correlation_id") or "")
        sent, _, qs = str(r.get("target") or "").partition("?")
        body, method = r.get("body"), r.get("method")
        if not cid:
            continue
        if method in _BODY_METHODS and isinstance(body, dict):
            narrow(cid, lambda op, s, c, p=sent, b=body: op.executor != "http" or not op.path
                   or (_path_fits(op, s, p, c) and _body_fits(op, s, b, c)))
        elif method not in _BODY_METHODS:
            narrow(cid, lambda op, s, c, p=sent, q=qs, m=method: op.executor != "http" or not op.path
                   or m != (op.method or "GET") or not _route_fits(op, p)
                   or (_path_fits(op, s, p, c) and _query_fits(op, s, parse_qsl(q, keep_blank_values=True), c)))
    return out


def _matched(candidates: dict[str, set[int]]) -> set[int]:
    """The steps a largest one-step-per-call matching covers (augmenting paths: a few calls)."""
    owner: dict[int, str] = {}

    def place(cid: str, seen: set[int]) -> bool:
        for i in sorted(candidates[cid]):
            if i in seen:
                continue
            seen.add(i)
            if i not in owner or place(owner[i], seen):
                owner[i] = cid
                return True
        return False

    for cid in candidates:
        place(cid, set())
    return set(owner)


def done_off_target(ev: Evidence, catalog: Catalog) -> list[str]:
    fits: dict[str, set[int]] | None = None
    out = []
    for agent in ev.agents:
        if not agent.steps or claim_of(agent.final) != "done":
            continue
        fits = step_fits(ev, catalog) if fits is None else fits
        # a restart continues its predecessor's task (the claim check's reading)
        same = {a.index for a in ev.agents if a.index <= agent.index and a.role == agent.role
                and a.steps == agent.steps}
        need = Counter(str(s.get("call")) for s in agent.steps)
        have: Counter[str] = Counter()
        candidates: dict[str, set[int]] = {}
        for lc in ev.timeline().calls:
            if (lc.agent_index in same or lc.holder in same) and lc.succeeded(by=agent.ended + 0.01):
                have[lc.operation] += 1
                mine = {i for i, s in enumerate(agent.steps) if s.get("call") == lc.operation}
                candidates[lc.cid] = fits.get(lc.cid, mine) & mine
        covered = _matched(candidates)
        short = [f"{s.get('call')} ({_shown(s.get('params') or {})})" for i, s in enumerate(agent.steps)
                 if i not in covered and have[str(s.get("call"))] >= need[str(s.get("call"))]]
        if short:
            out.append(f"agent {agent.index} ({agent.name}) claims completion{read_as(agent.final)}, but no "
                       f"success with these steps' parameters is on record (its calls of their operations "
                       f"went to other targets or repeated another step): {'; '.join(short)}")
    return out
