"""The TUI's activity pane says what an answer was: a lookup reads as a lookup, a resume as a resume.

The daemon's `activity` notification carries `kind` (call, resume, lookup) and, for a lookup, what
it found (`reconciled`) and the request whose token it told. The pane printed every answer as
`agent[pid] operation -> category`: a lookup of a create answered `success` read to the person as
a create that succeeded, when nothing ran (late43).
"""

from __future__ import annotations

from typing import Any

from textual.widgets import RichLog

from tui.messages import DaemonNotice
from tui_fixtures import NOW, feed, offline_app, until


def _answer(cid: str, kind: str, category: str, retry: str, **more: Any) -> tuple[str, dict[str, Any]]:
    return ("activity", {"time": NOW - 5, "agent": "filer", "pid": 4242, "session_id": "s-0009",
                         "operation": "create_issue", "category": category, "retry": retry,
                         "correlation_id": cid, "kind": kind, **more})


async def test_a_lookup_and_a_resume_read_as_what_they_were() -> None:
    app = offline_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await feed(app, pending=False)
        for method, params in (
                _answer("c-l1", "lookup", "success", "none", reconciled="found", lookup_of="c-1"),
                _answer("c-l2", "lookup", "success", "none", reconciled="unknown", lookup_of="c-2",
                        request_id="r-0042"),
                _answer("c-2", "resume", "approval_pending", "after_approval")):
            app.post_message(DaemonNotice(method, params))
        log = app.screen.query_one("#activity", RichLog)

        def text() -> str:  # the pane wraps long lines: read it as words
            return " ".join(" ".join(line.text for line in log.lines).split())

        await until(pilot, lambda: "resume create_issue" in text(), "the resume's line")
        shown = text()
        assert "filer[4242] lookup of create_issue -> found" in shown, shown
        assert "filer[4242] lookup of create_issue -> unknown, told the token of request r-0042" in shown, shown
        assert "filer[4242] resume create_issue -> approval_pending (retry: after_approval)" in shown, shown
        # a lookup never reads as the operation having run
        assert "filer[4242] create_issue -> success" not in shown, shown
        # a call reads as before
        assert "triage-bot[4121] create_issue -> success" in shown, shown
