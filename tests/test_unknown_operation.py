"""A call or lookup naming an operation no catalog has is refused and recorded, so a report can name it.

Found by the red team's seventh pass (tests/test_redteam_unsafe7.py, the runner's side): the
vault answered a `call` of `drop_database` with -32602 and wrote nothing, so an agent that
tried it and then did its task passed. Now each is an `unknown_operation` audit event (the
session, method and operation as sent; never parameters or a key), bounded per process as
`session_refused` is, and `audit show` prints it.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from audit_daemon_helpers import events
from helpers import PY, Sandbox, wait_for
from hostile_fixtures import run_script, setup


# a request's answer, its JSON-RPC error as {"error": {code, message}}
TRY = (
    "def attempt(method, **params):\n"
    "    try:\n"
    "        return {'result': client.request(method, **params)}\n"
    "    except Exception as exc:\n"
    "        return {'error': {'code': getattr(exc, 'rpc_code', None), 'message': str(exc)}}\n"
)


def unknown(sandbox: Sandbox, n: int) -> list[dict[str, Any]]:
    """The unknown_operation events, once `n` are in the log (queued for its next commit)."""
    def found() -> list[dict[str, Any]]:
        got = [e for e in events(sandbox) if e.get("type") == "unknown_operation"]
        return got if len(got) >= n else []
    return wait_for(found, what=f"{n} unknown_operation events")


@pytest.mark.timeout(300)
def test_a_call_and_a_lookup_of_an_operation_no_catalog_has_are_recorded_without_their_parameters(
        sandbox: Sandbox) -> None:
    setup(sandbox)
    got = run_script(sandbox, TRY + (
        "sid = client.open_session('prober', 'run-1')\n"
        "out(attempt('call', session_id=sid, operation='drop_database',\n"
        "            params={'name': 'prod-canary-param'}, idempotency_key='k-canary'))\n"
        "out(attempt('lookup', session_id=sid, correlation_id='c-guess', operation='drop_database'))\n"))
    assert -32602 == got[0]["error"]["code"] and "unknown operation" in got[0]["error"]["message"], got
    assert "unknown" == got[1]["result"]["reconciled"], got
    recorded = unknown(sandbox, 2)
    assert [("call", "drop_database"), ("lookup", "drop_database")] == \
        [(e["method"], e["operation"]) for e in recorded]
    text = json.dumps(events(sandbox))
    assert "prod-canary-param" not in text and "k-canary" not in text  # never parameters or keys
    shown = subprocess.run([PY, "-m", "vault.cli.main", "audit", "show", "--home", str(sandbox.home)],
                           env=sandbox.env, capture_output=True, text=True, timeout=60)
    assert "unknown_operation" in shown.stdout and "operation=drop_database" in shown.stdout, shown.stdout[-2000:]


@pytest.mark.timeout(300)
def test_a_flood_of_unknown_operations_is_recorded_at_powers_of_two(sandbox: Sandbox) -> None:
    """100 on one connection: the first 32 recorded, then the 64th only, each with its count."""
    setup(sandbox)
    got = run_script(sandbox, TRY + (
        "sid = client.open_session('prober', 'run-1')\n"
        "codes = [attempt('call', session_id=sid, operation=f'op_{i}', params={})['error']['code']\n"
        "         for i in range(100)]\n"
        "out(codes)\n"))
    assert [-32602] * 100 == got[0]
    assert [*range(1, 33), 64] == [e["count"] for e in unknown(sandbox, 33)]


@pytest.mark.timeout(300)
def test_reconnecting_starts_no_new_count(sandbox: Sandbox) -> None:
    """The bound was per connection: a process that opened a new connection (and session) for
    each of 100 unknown operations had every one recorded, growing the log without end. Counted
    per process, the same 100 leave 33 records."""
    setup(sandbox)
    got = run_script(sandbox, TRY + (
        "codes = []\n"
        "for i in range(100):\n"
        "    client = AgentClient(os.environ['VAULTSIM_SOCKET'], timeout=60)\n"
        "    sid = client.open_session('prober', 'run-1')\n"
        "    codes.append(attempt('call', session_id=sid, operation=f'op_{i}', params={})['error']['code'])\n"
        "    client.close()\n"
        "out(codes)\n"))
    assert [-32602] * 100 == got[0]
    recorded = unknown(sandbox, 33)
    # the last of the 100 was answered after the 64th was queued: whatever is recorded by now is all
    assert [*range(1, 33), 64] == [e["count"] for e in recorded]
