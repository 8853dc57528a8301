"""The daemon's memory of prompts stays bounded, and what leaves it goes to the audit log."""

from __future__ import annotations

from typing import Any

from vault.catalog import Risk
from vault.gate import stats as S
from vault.gate.stats import OTHER, PromptStats


class TestBounds:
    def test_the_least_recently_active_run_is_archived_and_forgotten(self, monkeypatch) -> None:
        """With room for 2 runs, a third evicts the one idle longest: its final counts are
        handed to the archive once, with its sessions, and report() no longer lists it."""
        monkeypatch.setattr(S, "MAX_RUNS", 2)
        archived: list[tuple[str, dict[str, Any]]] = []
        stats = PromptStats(archive=lambda run, counts: archived.append((run, counts)))
        stats.prompt("r1", "s1", "create_issue", Risk.create, "create_issue on tracker")
        stats.prompt("r2", "s2", "create_issue", Risk.create, "create_issue on tracker")
        stats.prompt("r1", "s1", "create_issue", Risk.create, "create_issue on tracker")  # r1 active again
        stats.prompt("r3", "s3", "read_issue", Risk.read, "read_issue on tracker")
        assert [("r2", 1)] == [(run, counts["prompts"]) for run, counts in archived]
        report = stats.report()
        assert {"r1", "r3"} == set(report["runs"]) and report["runs"]["r1"]["prompts"] == 2
        assert {"s1", "s3"} == set(report["sessions"])
        assert {"runs": {}, "sessions": {}} == stats.report("r2")

    def test_sessions_are_bounded_without_losing_run_totals(self, monkeypatch) -> None:
        """Many sessions in one run: the oldest session rows go, the run's totals stay exact."""
        monkeypatch.setattr(S, "MAX_SESSIONS", 3)
        stats = PromptStats()
        for i in range(10):
            stats.prompt("r", f"s{i}", "create_issue", Risk.create, "scope")
        report = stats.report("r")
        assert 10 == report["runs"]["r"]["prompts"]
        assert ["s7", "s8", "s9"] == sorted(report["sessions"])

    def test_new_scopes_past_the_cap_are_counted_together(self, monkeypatch) -> None:
        """An agent naming a new target on every call cannot grow the scope table."""
        monkeypatch.setattr(S, "MAX_KEYS", 4)
        stats = PromptStats()
        for i in range(10):
            stats.prompt("r", "s", "create_issue", Risk.create, f"scope-{i}")
        asked = stats.report("r")["runs"]["r"]["scopes_asked"]
        assert 5 == len(asked) and 6 == asked[OTHER] and 10 == sum(asked.values())

    def test_decision_times_keep_count_and_max_exact(self, monkeypatch) -> None:
        """Past the sample size, the count and the maximum are still exact."""
        monkeypatch.setattr(S, "MAX_SAMPLES", 5)
        stats = PromptStats()
        for i in range(20):
            stats.decision("r", "s", "allow_once", (i + 1) / 1000)
        ttd = stats.report("r")["runs"]["r"]["time_to_decision_ms"]
        assert (20, 20.0) == (ttd["count"], ttd["max"])
        assert ttd["p50"] in {16.0, 17.0, 18.0, 19.0, 20.0}

    def test_an_archive_that_fails_does_not_stop_the_gate(self, monkeypatch) -> None:
        """A failing archive (the audit log refuses) loses those counts, nothing else."""
        monkeypatch.setattr(S, "MAX_RUNS", 1)

        def refuse(run: str, counts: dict[str, Any]) -> None:
            raise RuntimeError("audit log failed")

        stats = PromptStats(archive=refuse)
        stats.prompt("r1", "s1", "x", Risk.create, "a")
        assert stats.prompt("r2", "s2", "x", Risk.create, "a") is False
        assert ["r2"] == list(stats.report()["runs"])
