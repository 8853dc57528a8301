"""A lookup that names a lookup's own correlation id is no license to resend.

An agent that keeps the wrong id (the lookup's answer's `correlation_id` in place of its
call's) and names an operation got the remote's view of an id it never saw: `not_found`, which
§6 reads as "it did not take effect, send it again", whatever the call it meant did. The vault
gave that id to a lookup, so it answers `unknown` and says which id to use.
"""

from __future__ import annotations

from helpers import Sandbox
from test_gate import agent_script, setup


def test_a_lookup_of_a_lookup_answers_unknown_not_not_found(sandbox: Sandbox) -> None:
    setup(sandbox)
    (read, looked, slip, never) = agent_script(sandbox, (
        "client.open_session('stub', 'run-1')\n"
        "r = client.call('read_issue', {'issue_id': 'ISS-1'})\n"
        "out(r)\n"
        "l = client.lookup(correlation_id=r.correlation_id)\n"
        "out(l)\n"
        "out(client.lookup(correlation_id=l.correlation_id, operation='create_issue'))\n"
        "out(client.lookup(correlation_id='c-the-vault-never-gave', operation='create_issue'))\n"
    ))
    assert read["category"] == "success"
    assert looked["reconciled"] == "not_found"  # a read leaves no effect (§6)
    assert (slip["category"], slip["reconciled"]) == ("success", "unknown")
    assert looked["correlation_id"] in slip["message"] and "idempotency_key" in slip["message"]
    # an id the vault never gave this agent names none of its calls (a call of its own from before
    # a restart carries its agent's and run's digest): unknown, nothing looked up. It was asked of
    # the remote, whose not_found licensed a resend of whatever the agent meant
    assert (never["category"], never["reconciled"]) == ("success", "unknown")
    assert "nothing was looked up" in never["message"]
