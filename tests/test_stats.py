"""Prompt statistics: the numbers `vaultsim stats` reports for a known sequence."""

from __future__ import annotations

import json

from helpers import Sandbox

TOKEN = "stats-token"
READ = {"call": "read_issue", "params": {"issue_id": "ISS-1"}}
CREATE = {"call": "create_issue", "params": {"title": "t"}}
DELETE = {"call": "delete_release", "params": {"release_id": "r-1"}}


def start(sandbox: Sandbox, *args: str) -> None:
    _, url = sandbox.start_remote({"tracker_token": TOKEN, "releases_token": TOKEN})
    sandbox.set_secret("tracker_token", TOKEN)
    sandbox.set_secret("releases_token", TOKEN)
    sandbox.start_daemon("--remote", url, *args)


def run_stats(sandbox: Sandbox, run_id: str) -> dict:
    return json.loads(sandbox.vaultsim("stats", "--json", "--run", run_id, check=True).stdout)


class TestStats:
    def test_counts_for_a_known_sequence(self, sandbox: Sandbox) -> None:
        """Two agent processes, session and per-call prompts, a denial: every counter exact."""
        start(sandbox)
        sandbox.start_approver([
            {"match": {"operation": "create_issue"}, "decide": "allow_session"},
            {"match": {"operation": "delete_release"}, "decide": "allow_once", "times": 1},
            {"match": {"operation": "delete_release"}, "decide": "deny"},
        ])
        first = sandbox.run_agent([READ, CREATE, CREATE, DELETE], run_id="r1")
        assert [r["category"] for r in first.results] == ["success"] * 4
        second = sandbox.run_agent([CREATE, DELETE], run_id="r1")
        assert [r["category"] for r in second.results] == ["success", "approval_denied"]

        report = run_stats(sandbox, "r1")
        run = report["runs"]["r1"]
        assert run["prompts"] == 4
        assert run["by_operation"] == {"create_issue": 2, "delete_release": 2}
        assert run["by_risk"] == {"create": 2, "delete": 2}
        assert run["scopes_asked"] == {"create_issue on tracker": 2, "delete_release on release r-1": 2}
        assert run["scopes_granted"] == {"create_issue on tracker": 2, "delete_release on release r-1": 1}
        assert run["decisions"] == {"allow_session": 2, "allow_once": 1, "deny": 1}
        assert run["time_to_decision_ms"]["count"] == 4
        assert run["repeated_scope_prompts"] == 2
        assert run["read_prompts"] == 0
        assert run["destructive_session_grants"] == 0
        assert run["unroutable"] == 0
        # per session: the first process was asked twice, the second twice
        sessions = report["sessions"]
        assert sorted(s["prompts"] for s in sessions.values()) == [2, 2]
        assert all(s["run_id"] == "r1" for s in sessions.values())

    def test_fatigue_signals(self, sandbox: Sandbox) -> None:
        """Prompts on reads and a session grant covering a delete are counted as such."""
        policy = sandbox.write("tired.yaml", {"risks": {"read": {"mode": "session"}, "delete": {"mode": "session"}}})
        start(sandbox, "--policy", str(policy))
        sandbox.start_approver([{"match": {}, "decide": "allow_session"}])
        sandbox.run_agent([READ, DELETE], run_id="r2")
        sandbox.run_agent([READ], run_id="r2")
        run = run_stats(sandbox, "r2")["runs"]["r2"]
        assert run["read_prompts"] == 2
        assert run["destructive_session_grants"] == 1
        assert run["repeated_scope_prompts"] == 1

    def test_unroutable_and_locked_are_counted_apart(self, sandbox: Sandbox) -> None:
        """No approver: unroutable, not a prompt; locked: a refusal, not a prompt."""
        start(sandbox)
        sandbox.run_agent([CREATE], run_id="r3")
        assert sandbox.vaultsim("lock").returncode == 0
        sandbox.run_agent([CREATE, READ], run_id="r3")
        run = run_stats(sandbox, "r3")["runs"]["r3"]
        assert (run["prompts"], run["unroutable"], run["locked_refusals"]) == (0, 1, 1)
