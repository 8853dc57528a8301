"""Red team, twelfth pass: careful agents never seen by the project must not get a false FAIL.

Written from docs/agent-contract.md alone:

    tests/agents/rt12c_node.mjs  Node.js (ES module): every request written in three pieces a tick
                                 apart, blocking waits, unicode keys; ends with JSON.stringify's
                                 output (a raw U+2028 in a string, or indented with its request log)

    tests/agents/rt12c_heavy.py  Python std, blocking sockets, heavy but allowed habits: every
                                 request written a byte per send() and read a byte per recv(),
                                 bursts of up to 63 `vault.status` in flight before each call,
                                 many short-lived children (sh, python reading /proc/self and
                                 listing $TMPDIR, one in its own session, a double fork) all
                                 ended before it goes on, scratch files with unicode names in
                                 $TMPDIR and state_dir, unicode idempotency keys (200 characters,
                                 past 255 percent-encoded) looked up before every write, one
                                 request a second, staying until 0.15 s before the deadline, a
                                 helper still ending (0.6 s) after the agent exits, final messages
                                 of 200 KB or 1.5 MB, in unicode, one JSON line with U+2028 in a
                                 string, or JSON indented over hundreds of lines

swept over the whole embedded suite in the jail and with `--isolation none` (42 trials each),
two sweeps at once (each the other's neighbour), the second from a read-only working directory
whose path holds spaces and emoji, without HOME, with LANG=C and a PATH of 300 entries, then
from / without HOME or TMPDIR; and through the pytest plugin (`pytest scenarios/
--vaultsim-agent`). Found and fixed here, each a done agent graded FAIL_OUTCOME: a final
message that a JSON encoder wrote on one line was cut at a U+2028 inside a string
(str.splitlines); one printed indented over more than 200 lines was not read whole; a Python
dict pprinted over several lines was read from its last line alone; one behind a byte-order
mark (.NET, PowerShell) was no JSON; one longer than the runner's 1 MiB output tail was read as
no message at all.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import ROOT
from test_redteam_careful import surprises, vaultsim_run
from vault.runner.claims import claim_of
from vault.runner.evidence import AgentRun

AGENTS = ROOT / "tests" / "agents"
SCENARIOS = ROOT / "scenarios"


def _final(stdout: str) -> str:
    return AgentRun(0, "a", "cmd", 1, 0.0, 1.0, 0, False, stdout, "").final


def test_a_final_message_is_one_line_up_to_its_newline() -> None:
    """`JSON.stringify` and `json.dumps(ensure_ascii=False)` leave U+2028 and U+2029 raw inside a
    string, and text from a remote or a model can hold them or NEL: the line ends at `\\n` (as the
    contract says), not where str.splitlines() would cut it. The claim was read from the tail of
    the cut line: not done, for a done agent (FAIL_OUTCOME)."""
    one_line = json.dumps({"status": "done", "message": "create: ISS-1\u2028note: N-1\u2029read: ok"},
                          ensure_ascii=False)
    assert "\n" not in one_line
    assert "done" == claim_of(_final("log: working\n" + one_line + "\n"))
    for text in ("done: filed ISS-1\u2028then noted it", "done: a\x85b", "waiting: a\x0cb", "done: a\x1cb"):
        assert claim_of(text.split(":")[0]) == claim_of(_final("log: x\n" + text + "\n")), repr(text)
    # the line ends a terminal shows are still line ends
    assert "done" == claim_of(_final("log: x\r\ndone\r\n"))
    assert "done" == claim_of(_final("progress 50%\rdone\n"))


def test_an_indented_json_final_message_is_read_whole_however_long() -> None:
    """An agent printing its whole request log with its status, `json.dumps(report, indent=2)`:
    past 200 lines the opening brace was not looked for, the last line `}` read alone claimed
    nothing, and the done agent was graded FAIL_OUTCOME."""
    report = {"status": "done", "message": "3 steps", "log": [{"id": i, "method": "vault.status",
                                                              "category": None} for i in range(120)]}
    for indent in (2, 4):
        text = json.dumps(report, indent=indent)
        assert text.count("\n") > 200
        assert "done" == claim_of(_final("log: a\n" + text + "\n"))
    # nested objects open deeper than the closing brace: never taken for its start
    assert "done" == claim_of(_final("{\n" + json.dumps({"status": "done", "x": [{"a": {}}] * 50}, indent=2) + "\n"))
    # the bound stays: a log line ending in a brace is no claim, a flood of braces costs little
    assert "not_done" == claim_of(_final("progress {\n}"))
    assert "not_done" == claim_of(_final("{\n" * 20000 + "}\n"))
    assert "wait" == claim_of(_final('  {\n  "status": "waiting"\n  }\n'))


# two agents, one after another (approved, then a restart), and a done agent alone
FEW = [SCENARIOS / f"{k}.yaml" for k in ("gate-1-healthy-delivery", "gate-6-restart-resumes-receipt")]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("final,extra", [("json_ls", ()), ("indent_log", ("--isolation", "none"))])
def test_careful_agents_with_long_or_unicode_json_final_messages_are_released(
        tmp_path: Path, final: str, extra: tuple[str, ...]) -> None:
    """rt12c_heavy ends with one JSON line whose step notes are joined by U+2028, or with its
    request log as JSON indented over hundreds of lines (each call preceded by a burst of status
    requests): released, each final message read as the done it says."""
    run = vaultsim_run(FEW, f"env RT12_FINAL={final} RT12_BURST=40 RT12_UNI=1 {{python}} {AGENTS / 'rt12c_heavy.py'}",
                       tmp_path / "r.json", *extra)
    assert (0, []) == (run["code"], surprises(run)), run["out"][-3000:]
    finals = [a["final"] for s in run["json"]["scenarios"] for t in s["trial_results"] for a in t["agents"]]
    assert finals and all(f.startswith("{") for f in finals), finals


def test_a_json_final_message_behind_a_byte_order_mark_is_read_as_json() -> None:
    """A .NET or PowerShell agent with UTF-8 output writes a byte-order mark before its first
    output; when that is its final message (its only line, or JSON it prints indented), the BOM
    made `{"status": "done"}` no JSON and the done agent FAIL_OUTCOME (a text `done` was read
    through it already). Nor do a NUL after it (a C agent writing its terminator) or a
    zero-width space before it hide the object."""
    assert "done" == claim_of(_final('\ufeff{"status": "done", "message": "3 steps"}\n'))
    assert "done" == claim_of(_final("\ufeff" + json.dumps({"status": "done", "data": {"id": "ISS-1"}}, indent=2) + "\n"))
    assert "wait" == claim_of(_final('log\n\u200b{"status": "waiting", "request_id": "r-1"}\n'))
    assert "done" == claim_of(_final('log\n{"status": "done"}\x00\n'))
    assert "not_done" == claim_of(_final('\ufeff{"status": "not_done"}\n'))
    assert "done" == claim_of(_final("\ufeffdone\n"))


def test_a_final_message_longer_than_the_output_tail_is_read_whole(tmp_path: Path) -> None:
    """The runner holds the last MiB of an agent's output; a final JSON message of 1.5 MB (its
    result data) was cut there, read as "nothing on stdout" and graded FAIL_OUTCOME. The last
    line is now read whole up to FINAL_LINE_MOST (4 MiB); what comes before it stays bounded."""
    from vault.runner.trial import FINAL_LINE_MOST, OUTPUT_TAIL, output_tail
    big = json.dumps({"status": "done", "data": "x" * (OUTPUT_TAIL * 3 // 2)}).encode()
    out = tmp_path / "stdout"
    for text in (b"log: a\n" * 1000 + big + b"\n", big + b"\n", big, b"log\n" + big + b"\r\n\r\n"):
        out.write_bytes(text)
        assert "done" == claim_of(_final(output_tail(out)))
    out.write_bytes(b"log: a\n" * 300_000 + b"done: 3 steps\n")
    tail = output_tail(out)
    assert len(tail) <= OUTPUT_TAIL and "done" == claim_of(_final(tail))
    out.write_bytes(b"done " + b"y" * FINAL_LINE_MOST + b"\n")  # past the bound: not held
    assert len(output_tail(out)) <= OUTPUT_TAIL


@pytest.mark.timeout(300)
def test_a_careful_agent_with_a_final_message_of_one_and_a_half_megabytes_is_released(tmp_path: Path) -> None:
    run = vaultsim_run([SCENARIOS / "gate-1-healthy-delivery.yaml"],
                       f"env RT12_FINAL=json RT12_BIG=1500000 {{python}} {AGENTS / 'rt12c_heavy.py'}", tmp_path / "r.json")
    assert (0, []) == (run["code"], surprises(run)), run["out"][-3000:]


def test_a_python_dict_pprinted_over_several_lines_is_read_whole() -> None:
    """`pprint(result)`, a Python agent's way to show a dict too wide for one line: the contract
    reads a Python dict printed with single quotes as JSON, but over several lines its last line
    (` 'status': 'done'}`) was read alone and claimed nothing: a done agent FAIL_OUTCOME."""
    import io
    import pprint
    for status, claim in (("done", "done"), ("waiting", "wait"), ("not_done", "not_done")):
        buf = io.StringIO()
        pprint.pprint({"status": status, "message": "filed ISS-1, attached the note, read it back to check",
                       "data": {"create": {"id": "ISS-1"}}}, stream=buf)
        assert buf.getvalue().count("\n") > 1
        assert claim == claim_of(_final("log: a\n" + buf.getvalue()))
    # a one-line object is read as it is, never joined with a log object above it
    assert '{"status": "done"}' == _final('{"log": 1}\n{"status": "done"}\n')


@pytest.mark.timeout(600)
@pytest.mark.parametrize("final,extra", [("line", ()), ("pretty", ("--isolation", "none"))])
def test_a_node_agent_ending_with_json_stringify_is_released(tmp_path: Path, final: str, extra: tuple[str, ...]) -> None:
    """rt12c_node.mjs (each request written in three pieces a tick apart) ends with
    `console.log(JSON.stringify(r))`, whose string holds a raw U+2028 (JavaScript leaves it
    unescaped), or `JSON.stringify(r, null, 2)` with its request log: on main both were
    FAIL_OUTCOME on gate-1 and gate-6 (a done agent read as not done)."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    run = vaultsim_run(FEW, f"env RT12N_FINAL={final} node {AGENTS / 'rt12c_node.mjs'}", tmp_path / "r.json", *extra)
    assert (0, []) == (run["code"], surprises(run)), run["out"][-3000:]
    claims = [t["claim"] for s in run["json"]["scenarios"] for t in s["trial_results"]]
    assert claims and all(c == "done" for c in claims), claims
