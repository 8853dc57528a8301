"""Bad frames never hurt the daemon: each gets a JSON-RPC error or a clean close."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import Sandbox, new_sandbox, wait_for
from vault.client import AgentClient

ERROR_CODES = {-32700, -32600, -32601, -32602}


@pytest.fixture(scope="module")
def served() -> Iterator[Sandbox]:
    box = new_sandbox()
    box.start_daemon()
    try:
        yield box
    finally:
        box.close()
        shutil.rmtree(box.root, ignore_errors=True)


def exchange(path: str, payload: bytes, close_write: bool = True) -> list[dict]:
    """Send raw bytes, half-close, read every reply line until the daemon closes."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    try:
        s.sendall(payload)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the daemon may close an oversized frame before we finish sending
    if close_write:
        s.shutdown(socket.SHUT_WR)
    buf = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        buf += chunk
    s.close()
    return [json.loads(line) for line in buf.splitlines() if line.strip()]


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=10)
methods = st.sampled_from(["call", "session.open", "lookup", "call.resume", "session.close", "vault.status", "nope", ""])
requestish = st.fixed_dictionaries(
    {}, optional={"jsonrpc": st.sampled_from(["2.0", "1.0", 2]) | json_scalars,
                  "id": st.integers() | st.text(max_size=8) | json_values,
                  "method": methods | json_scalars,
                  "params": json_values})

frames = st.one_of(
    st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ") + b"\n"),  # garbage bytes
    json_values.map(lambda v: json.dumps(v).encode() + b"\n"),  # any JSON, mostly non-requests
    requestish.map(lambda v: json.dumps(v).encode() + b"\n"),  # request-shaped, wrong types
    requestish.map(lambda v: json.dumps(v).encode()[: max(1, len(json.dumps(v)) // 2)]),  # truncated, no newline
)


class TestFrames:
    @settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(frame=frames)
    def test_each_bad_frame_gets_an_error_or_a_clean_close(self, served: Sandbox, frame: bytes) -> None:
        """Garbage, non-objects, wrong types and truncated frames: error answers only."""
        replies = exchange(str(served.agent_sock), frame)
        for reply in replies:
            assert reply.get("jsonrpc") == "2.0"
            if "error" in reply:
                assert reply["error"]["code"] in ERROR_CODES | {-32001}
            else:
                # a frame that happened to be a valid request gets a real answer
                assert "result" in reply

    def test_oversized_frame_is_refused_and_daemon_serves_on(self, served: Sandbox) -> None:
        """A line over 1 MiB is answered -32600 and only that connection closes."""
        replies = exchange(str(served.agent_sock), b"{" + b"x" * (1 << 20) + b"}\n")
        assert replies and replies[0]["error"]["code"] == -32600
        assert "1 MiB" in replies[0]["error"]["message"]
        assert served.status() is not None

    def test_half_sent_line_then_close(self, served: Sandbox) -> None:
        """A client that sends half a request and leaves breaks nothing: if it can still read
        (it only shut its write side) it is told the line is not JSON; nothing is done."""
        assert [-32700] == [r["error"]["code"] for r in exchange(str(served.agent_sock),
                                                                 b'{"jsonrpc":"2.0","id":1,"meth')]
        assert served.status() is not None

    def test_bad_frame_does_not_disturb_another_client(self, served: Sandbox) -> None:
        """A good client connected before and after a flood of garbage keeps working."""
        good = AgentClient(served.agent_sock, timeout=10)
        sid = good.open_session("good-agent")
        for payload in (b"\xff\xfe\n", b"[1,2]\n", b'{"jsonrpc":"2.0","id":1,"method":"call","params":[1]}\n'):
            exchange(str(served.agent_sock), payload)
        assert good.request("vault.status")["sessions"] >= 1
        assert good.session_id == sid
        good.close()

    @pytest.mark.parametrize("payload, code", [
        (b"not json\n", -32700),
        (b"[]\n", -32600),
        (b'{"jsonrpc":"2.0","id":1}\n', -32600),
        (b'{"jsonrpc":"2.0","id":1,"method":"no.such"}\n', -32601),
        (b'{"jsonrpc":"2.0","id":1,"method":"session.open","params":{"agent":5}}\n', -32602),
        (b'{"jsonrpc":"2.0","id":1,"method":"call","params":{"session_id":"s","operation":"x","bogus":1}}\n', -32602),
        # valid JSON, but an integer longer than Python converts (4,300 digits)
        (b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"vault.status"}\n', -32700),
    ], ids=["parse", "batch", "no-method", "unknown-method", "wrong-type", "extra-param", "huge-integer"])
    def test_error_codes(self, served: Sandbox, payload: bytes, code: int) -> None:
        """Each class of bad input gets its JSON-RPC code."""
        replies = exchange(str(served.agent_sock), payload)
        assert [r["error"]["code"] for r in replies] == [code]


class TestLimits:
    """One client cannot grow the daemon without bound; it gets a clear error instead."""

    def test_requests_past_the_in_flight_limit_are_refused_and_nothing_is_done(self, sandbox: Sandbox) -> None:
        from vault.daemon.rpc_server import MAX_IN_FLIGHT

        sandbox.start_daemon()
        sandbox.start_approver([{"match": {}, "decide": "ignore"}])  # calls wait on approval
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(str(sandbox.agent_sock))
        reader = s.makefile("rb")
        sessions = []  # several: one session's waiting prompts have a lower cap of their own
        for n in range(4):
            s.sendall(json.dumps({"jsonrpc": "2.0", "id": f"open-{n}", "method": "session.open",
                                  "params": {"agent": "flood"}}).encode() + b"\n")
            sessions.append(json.loads(reader.readline())["result"]["session_id"])
        extra = 3
        frames = b"".join(json.dumps({"jsonrpc": "2.0", "id": i, "method": "call", "params": {
            "session_id": sessions[i % 4], "operation": "create_issue", "params": {"title": f"t{i}"},
            "wait_s": 60}}).encode() + b"\n" for i in range(1, MAX_IN_FLIGHT + extra + 1))
        s.sendall(frames)
        refused = [json.loads(reader.readline()) for _ in range(extra)]
        assert {r["id"] for r in refused} == set(range(MAX_IN_FLIGHT + 1, MAX_IN_FLIGHT + extra + 1))
        for r in refused:
            assert r["error"]["code"] == -32004
            assert "too many requests in progress" in r["error"]["message"]
        # the refused requests asked nobody: only the calls under the limit wait on approval
        wait_for(lambda: (sandbox.status() or {}).get("pending") == MAX_IN_FLIGHT,
                 what="the calls under the limit to wait on approval")
        assert MAX_IN_FLIGHT == sandbox.status()["pending"]
        # another client is served meanwhile
        other = AgentClient(sandbox.agent_sock)
        assert other.open_session("other").startswith("s-")
        other.close()
        reader.close()
        s.close()

    def test_sessions_per_connection_are_capped(self, sandbox: Sandbox) -> None:
        from vault.daemon.agent_api import MAX_SESSIONS_PER_CONNECTION
        from vault.client import RpcClient
        from vault.errors import RpcError

        sandbox.start_daemon()
        with RpcClient(sandbox.agent_sock, timeout=30) as c:
            ids = [c.request("session.open", agent=f"a{i}")["session_id"]
                   for i in range(MAX_SESSIONS_PER_CONNECTION)]
            with pytest.raises(RpcError) as err:
                c.request("session.open", agent="one-too-many")
            assert err.value.rpc_code == -32004 and "close one" in err.value.message
            c.request("session.close", session_id=ids[0])
            assert c.request("session.open", agent="after-close")["session_id"].startswith("s-")


class TestNames:
    @pytest.mark.parametrize("name", ["evil\x1b[2J", "rtl\u202eabc", "tab\tname", "nul\x00"],
                             ids=["escape", "bidi", "tab", "nul"])
    def test_agent_name_that_could_steer_a_screen_is_refused(self, served: Sandbox, name: str) -> None:
        """Names are shown to approvers: control and format characters are bad params."""
        from vault.client import RpcClient
        from vault.errors import RpcError
        with RpcClient(served.agent_sock, timeout=10) as c:
            with pytest.raises(RpcError) as err:
                c.request("session.open", agent=name)
            assert -32602 == err.value.rpc_code and "printable" in err.value.message
            with pytest.raises(RpcError):
                c.request("session.open", agent="fine", run_id=name)
            assert c.request("session.open", agent="ünïcode agent")["session_id"].startswith("s-")


@pytest.mark.parametrize("rid", [7, 2**70, "r-\u00e9", None])
def test_a_result_model_is_framed_as_its_dict_would_be(rid: object) -> None:
    """The answer to a call is written from pydantic's own JSON (no dict made to be encoded
    again): the same bytes as before, a lone surrogate still escaped rather than lost."""
    from vault import jsonrpc as rpc
    from vault.daemon.rpc_server import _result_frame
    from vault.models import Category, make_result
    for result in (make_result(Category.success, "read_issue", "c-1", "Done \u2028 ✓", data={"a": 1.5, "b": [1, None]}),
                   make_result(Category.rate_limited, "op", "c-1", "later", retry_after_s=5.0),
                   make_result(Category.success, "op", "c-1", "not \ud800 text")):
        assert rpc.encode_result(rid, result.model_dump(mode="json", exclude_none=True)) == _result_frame(rid, result)
    assert rpc.encode_result(rid, {"x": 1}) == _result_frame(rid, {"x": 1})
