"""The daemon's memory of calls for `lookup` is bounded: the oldest are forgotten first."""

from __future__ import annotations

from vault.daemon import calls
from vault.daemon.calls import CallMemory as CallPipeline, CallRecord


class Remembering(CallPipeline):
    """The call memory alone (its own fields, as the daemon makes them: a copy of them here
    missed the key senders added since)."""


class TestRememberedCalls:
    def test_oldest_calls_and_their_keys_are_forgotten_past_the_cap(self, monkeypatch) -> None:
        """With a cap of 3, a fourth call drops the first and its idempotency key."""
        monkeypatch.setattr(calls, "MAX_REMEMBERED_CALLS", 3)
        p = Remembering()
        for i in range(4):
            p._remember(f"c-{i}", CallRecord("create_issue", f"k-{i}", "s", "stub", "run"))
        assert list(p.calls) == ["c-1", "c-2", "c-3"]
        assert p.by_idem == {("run", "stub", f"k-{i}"): f"c-{i}" for i in (1, 2, 3)}

    def test_a_key_reused_by_a_later_call_survives_the_older_ones_eviction(self, monkeypatch) -> None:
        """A key that now names a newer call is not dropped with the old call."""
        monkeypatch.setattr(calls, "MAX_REMEMBERED_CALLS", 2)
        p = Remembering()
        p._remember("c-0", CallRecord("create_issue", "k", "s", "stub", "run"))
        p._remember("c-1", CallRecord("create_issue", "k", "s", "stub", "run"))
        p._remember("c-2", CallRecord("read_issue", None, "s", "stub", "run"))
        assert list(p.calls) == ["c-1", "c-2"]
        assert p.by_idem == {("run", "stub", "k"): "c-1"}
