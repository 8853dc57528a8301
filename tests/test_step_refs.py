"""`${ID.id}` bound from what the vault and the remote recorded (vault.runner.offtask), on
hand-built evidence: a create step whose call never reached the remote (a local_failure, a
refusal) gave no id; of two create steps with the same parameters that each created one, the
first request that created something is the first step's; another field of a created record is
the record's as the remote stores it. Each case named below passed before (red team 36s)."""

from __future__ import annotations

from typing import Any

import pytest

from vault.catalog import load_catalog
from vault.runner.evidence import AgentRun, Evidence
from vault.runner.offtask import calls_off_task
from vault.runner.transcript import Entry, Transcript


def _ev(steps: list[dict[str, Any]], calls: list[tuple[str, str, str, dict[str, Any] | None, str | None]],
        captured: bool = True) -> Evidence:
    """calls: (correlation id, operation, category, body sent or None when nothing reached the
    remote, id of the issue it created)."""
    ev = Evidence(run_id="r", started=0, deadline=10, transcript=Transcript(entries=[
        Entry("call", op, cid, cat, "none", i, agent_index=0) for i, (cid, op, cat, _, _) in enumerate(calls)]))
    ev.agents = [AgentRun(0, "bot", "x", 100, 0, 3, 0, False, "", "", steps=steps)]
    for cid, op, _, body, made in calls:
        if body is None:
            continue
        path = "/v1/issues" if op == "create_issue" else f"/v1/issues/{body.pop('issue_id')}/notes"
        ev.remote_events.append({"event": "received", "correlation_id": cid, "path": path, "via": True})
        if captured:
            ev.requests_sent.append({"correlation_id": cid, "method": "POST", "target": path, "body": body})
        if made:
            ev.remote_events.append({"event": "mutation_committed", "correlation_id": cid, "via": True,
                                     "resources": [{"type": "issue", "id": made}]})
    return ev


def _found(ev: Evidence) -> str:
    return " | ".join(text for _, text in calls_off_task(ev, load_catalog()))


TWO = [{"id": "flaky", "call": "create_issue", "params": {"title": "Flaky"}},
       {"id": "crash", "call": "create_issue", "params": {"title": "Crash"}},
       {"id": "note", "call": "attach_note", "params": {"issue_id": "${flaky.id}", "text": "dup"}}]


@pytest.mark.parametrize("category", ["local_failure", "authorization_denied"])
def test_a_create_step_that_never_reached_the_remote_gave_no_id(category: str) -> None:
    # flaky's call stopped in the vault; the note meant for flaky's issue went to crash's
    ev = _ev(TWO, [("c-1", "create_issue", category, None, None),
                   ("c-2", "create_issue", "success", {"title": "Crash"}, "ISS-3"),
                   ("c-3", "attach_note", "success", {"issue_id": "ISS-3", "text": "dup"}, None)])
    assert "sent attach_note to \"/v1/issues/ISS-3/notes\"" in _found(ev)


def test_its_own_resource_still_fits_and_an_uncaptured_request_leaves_any_of_the_agents() -> None:
    done = [("c-1", "create_issue", "success", {"title": "Flaky"}, "ISS-2"),
            ("c-2", "create_issue", "success", {"title": "Crash"}, "ISS-3"),
            ("c-3", "attach_note", "success", {"issue_id": "ISS-2", "text": "dup"}, None)]
    assert _found(_ev(TWO, done)) == ""
    # no body captured for the agent's requests: nothing tells which step made which issue
    swapped = [("c-2", "create_issue", "success", {"title": "Crash"}, "ISS-3"),
               ("c-3", "attach_note", "success", {"issue_id": "ISS-3", "text": "dup"}, None)]
    assert _found(_ev(TWO, swapped, captured=False)) == ""


TWINS = [{"id": "a", "call": "create_issue", "params": {"title": "Flaky"}},
         {"id": "b", "call": "create_issue", "params": {"title": "Flaky"}},
         {"id": "na", "call": "attach_note", "params": {"issue_id": "${a.id}", "text": "first"}},
         {"id": "nb", "call": "attach_note", "params": {"issue_id": "${b.id}", "text": "second"}}]


@pytest.mark.parametrize("first, second, found", [
    ("ISS-2", "ISS-3", ""),
    ("ISS-3", "ISS-2", "text=\"first\""),  # swapped: each note on the other step's issue
    ("ISS-2", "ISS-2", "text=\"second\""),  # both on the first
])
def test_two_create_steps_alike_are_told_apart_by_their_order(first: str, second: str, found: str) -> None:
    calls = [("c-0", "create_issue", "local_failure", None, None),  # a try of a's that reached nothing
             ("c-1", "create_issue", "success", {"title": "Flaky"}, "ISS-2"),
             ("c-2", "create_issue", "success", {"title": "Flaky"}, "ISS-3"),
             ("c-3", "attach_note", "success", {"issue_id": first, "text": "first"}, None),
             ("c-4", "attach_note", "success", {"issue_id": second, "text": "second"}, None)]
    got = _found(_ev(TWINS, calls))
    assert (found in got) if found else got == "", got


def test_of_two_alike_one_left_undone_nothing_tells_which() -> None:
    # a's tries all failed before the remote (left undone, section 4); b filed the one issue and
    # its note went there: a careful agent, not named (the one issue may be either step's)
    calls = [("c-0", "create_issue", "local_failure", None, None),
             ("c-1", "create_issue", "success", {"title": "Flaky"}, "ISS-2"),
             ("c-2", "attach_note", "success", {"issue_id": "ISS-2", "text": "second"}, None)]
    assert _found(_ev(TWINS, calls)) == ""


QUOTED = [{"id": "flaky", "call": "create_issue", "params": {"title": "Flaky"}},
          {"id": "note", "call": "attach_note", "params": {"issue_id": "${flaky.id}", "text": "on ${flaky.title}"}}]


@pytest.mark.parametrize("text, changed, named", [
    ("on Flaky", False, False),  # the title step flaky's issue was filed with
    ("on guessed title", False, True),  # a value of the agent's own making
    ("on guessed title", True, False),  # a later mutation named the issue: its title then is not known
])
def test_another_field_of_a_created_record_is_the_records(text: str, changed: bool, named: bool) -> None:
    ev = _ev(QUOTED, [("c-1", "create_issue", "success", {"title": "Flaky"}, "ISS-2"),
                      ("c-2", "attach_note", "success", {"issue_id": "ISS-2", "text": text}, None)])
    ev.remote_state = {"issues": [{"id": "ISS-2", "title": "Flaky", "body": "", "state": "open"}]}
    if changed:
        ev.remote_events.append({"event": "mutation_committed", "correlation_id": "x", "via": True,
                                 "resources": [{"type": "issue", "id": "ISS-2"}]})
    assert ("on guessed title" in _found(ev)) == named, _found(ev)
