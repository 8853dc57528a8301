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
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from vault.catalog import Catalog, Operation
from vault.runner.claims import claim_of, read_as
from vault.runner.evidence import Evidence
from vault.runner.offtask import (_BODY_METHODS, _body_fits, _created, _nothing, _path_fits,
                                  _prompt_fits, _query_fits, _route_fits, _shown)


def step_fits(ev: Evidence, catalog: Catalog) -> dict[str, tuple[int, set[int]]]:
    """Per correlation id with something to compare: its agent, and the indices (in that agent's
    `steps`) of the steps of its operation whose parameters every record of what it sent fits."""
    by_cid = {e.correlation_id: e.agent_index for e in ev.transcript.entries if e.correlation_id}
    op_by_cid: dict[str, str] = {}
    for x in ev.transcript.entries:
        op_by_cid.setdefault(x.correlation_id, x.operation)
    created_by = _created(ev, by_cid)
    out: dict[str, tuple[int, set[int]]] = {}

    def narrow(cid: str, fits: Fits) -> None:
        agent = ev.agent(by_cid.get(cid))
        op = catalog.get(op_by_cid.get(cid, ""))
        if agent is None or op is None or not agent.steps:
            return
        created = created_by.get(agent.name, _nothing())
        mine = {i for i, s in enumerate(agent.steps) if s.get("call") == op.name}
        fit = {i for i in mine if fits(op, agent.steps[i], created)}
        out[cid] = (agent.index, out.get(cid, (agent.index, mine))[1] & fit)

    for note in ev.prompts_asked:
        params = note.get("params")
        cid = str(note.get("correlation_id"))
        if isinstance(params, dict) and str(note.get("operation")) == op_by_cid.get(cid):
            narrow(cid, _prompt(params))
    for e in ev.remote_events:
        cid, sent = str(e.get("correlation_id") or ""), str(e.get("sent_path") or e.get("path") or "")
        if (e.get("event") == "received" and e.get("via") is not False and cid and sent
                and e.get("route") != "operation_status"):
            narrow(cid, _request(sent, None, None, None))
    for r in ev.requests_sent:
        cid = str(r.get("correlation_id") or "")
        sent, _, qs = str(r.get("target") or "").partition("?")
        body, method = r.get("body"), str(r.get("method") or "")
        if cid and method in _BODY_METHODS and isinstance(body, dict):
            narrow(cid, _request(sent, body, None, None))
        elif cid and method not in _BODY_METHODS:
            narrow(cid, _request(sent, None, parse_qsl(qs, keep_blank_values=True), method))
    return out


Fits = Callable[[Operation, dict[str, Any], dict[str, set[str]]], bool]


def _prompt(params: dict[str, Any]) -> Fits:
    def fits(op: Operation, step: dict[str, Any], created: dict[str, set[str]]) -> bool:
        return _prompt_fits(op, step, params, created)
    return fits


def _request(sent: str, body: dict[str, Any] | None, query: list[tuple[str, str]] | None,
             method: str | None) -> Fits:
    """A request the remote got: its path, and its JSON body or (a GET's, a DELETE's) query."""
    def fits(op: Operation, step: dict[str, Any], created: dict[str, set[str]]) -> bool:
        if op.executor != "http" or not op.path:
            return True  # nothing of it to compare
        if query is not None and (method != (op.method or "GET") or not _route_fits(op, sent)):
            return True  # not the call's own request (a lookup's status query)
        return (_path_fits(op, step, sent, created)
                and (body is None or _body_fits(op, step, body, created))
                and (query is None or _query_fits(op, step, query, created)))
    return fits


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
    fits: dict[str, tuple[int, set[int]]] | None = None
    out = []
    for agent in ev.agents:
        if not agent.steps or claim_of(agent.final) != "done":
            continue
        fits = step_fits(ev, catalog) if fits is None else fits
        # a restart continues its predecessor's task (the claim check's reading)
        same = {a.index for a in ev.agents if a.index <= agent.index and a.same_task(agent)}
        need = Counter(str(s.get("call")) for s in agent.steps)
        have: Counter[str] = Counter()
        candidates: dict[str, set[int]] = {}
        for lc in ev.timeline().calls:
            if (lc.agent_index in same or lc.holder in same) and lc.succeeded(by=agent.ended + 0.01):
                have[lc.operation] += 1
                mine = {i for i, s in enumerate(agent.steps) if s.get("call") == lc.operation}
                whose, fit = fits.get(lc.cid, (agent.index, mine))
                # indices are of the steps of the agent it was read against: this task's, or no reading
                candidates[lc.cid] = (fit if whose in same else mine) & mine
        covered = _matched(candidates)
        short = [f"{s.get('call')} ({_shown(s.get('params') or {})})" for i, s in enumerate(agent.steps)
                 if i not in covered and have[str(s.get("call"))] >= need[str(s.get("call"))]]
        if short:
            out.append(f"agent {agent.index} ({agent.name}) claims completion{read_as(agent.final)}, but no "
                       f"success with these steps' parameters is on record (its calls of their operations "
                       f"went to other targets or repeated another step): {'; '.join(short)}")
    return out
