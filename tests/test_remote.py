"""The fault-injecting fake remote on its own: bytes on the wire, ledger, events, processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from remote_fixtures import make_canary
from vault.errors import BadInput
from vault.remote import FaultSpec, RemoteServer, RemoteThread
from vault.remote.auth import load_credentials

ROOT = Path(__file__).resolve().parent.parent
TOKEN = make_canary()
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator:
    servers: list[RemoteServer] = []

    async def make(fault: str | None = None) -> RemoteServer:
        server = RemoteServer({"tracker_token": TOKEN, "other_token": TOKEN + "-other"},
                              FaultSpec.parse(fault) if fault else None, tmp_path / f"ev{len(servers)}.jsonl")
        await server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.stop()


async def raw(server: RemoteServer, request: bytes, *, until: bytes | None = None, limit: float = 5.0) -> bytes:
    """Send bytes, read until EOF (or until `until` appears), return what came back."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(request)
    await writer.drain()
    data = b""
    try:
        async with asyncio.timeout(limit):
            while chunk := await reader.read(65536):
                data += chunk
                if until is not None and until in data:
                    break
    finally:
        writer.close()
    return data


def head_and_body(data: bytes) -> tuple[dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    headers[":status"] = lines[0].split()[1]
    return headers, body


def post_issue(cid: str, body: bytes = b'{"title": "x"}', extra: bytes = b"") -> bytes:
    return (b"POST /v1/issues HTTP/1.1\r\nHost: r\r\nX-Correlation-Id: " + cid.encode() +
            b"\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: " +
            str(len(body)).encode() + b"\r\nConnection: close\r\n" + extra + b"\r\n" + body)


class TestFaultSpec:
    def test_parse_params_and_target(self) -> None:
        """NAME:k=v,op=X gives typed params with defaults and a target."""
        spec = FaultSpec.parse("late_response_after_commit:delay=2,times=1,op=create_issue")
        assert ("late_response_after_commit", 2.0, 1, "create_issue") == (
            spec.name, spec.params["delay"], spec.params["times"], spec.operation)
        assert FaultSpec.parse(str(spec)) == spec
        assert FaultSpec.from_dict(FaultSpec.parse("timeout_during_body").to_dict()).params["delay"] == float("inf")

    @pytest.mark.parametrize("text", ["nope", "rate_limited:when=1", "rate_limited:retry_after=x",
                                      "error_status_html:status=100", "timeout_after_accept:commit=maybe",
                                      "rate_limited:retry_after", "expired_token:after=0"],
                             ids=["unknown", "unknown-param", "bad-int", "bad-status", "bad-bool", "no-value",
                                  "never-accepted"])
    def test_bad_specs(self, text: str) -> None:
        """Bad fault text is BadInput naming the problem."""
        with pytest.raises(BadInput):
            FaultSpec.parse(text)


class TestWire:
    async def test_timeout_during_body_sends_half_then_stalls(self, start) -> None:
        """Headers promise N bytes, half arrive, then nothing until the client leaves."""
        server = await start("timeout_during_body")
        task = asyncio.ensure_future(raw(server, post_issue("c-half")))
        await _wait_event(server, "c-half", "response_body_stalled")
        await _wait_until(lambda: server.ledger.find(request_id="c-half")["effects"] == 1)
        server.release()
        headers, body = head_and_body(await task)
        assert len(body) == int(headers["content-length"]) // 2

    async def test_truncated_json_keeps_framing(self, start) -> None:
        """Content-Length matches what is sent; the JSON itself is cut."""
        server = await start("truncated_json")
        headers, body = head_and_body(await raw(server, post_issue("c-trunc")))
        assert (str(len(body)), "201") == (headers["content-length"], headers[":status"])
        with pytest.raises(ValueError):
            json.loads(body)

    async def test_timeout_after_headers_never_reads_the_body(self, start) -> None:
        """The request head is logged, the body is never processed, nothing commits."""
        server = await start("timeout_after_headers")
        task = asyncio.ensure_future(raw(server, post_issue("c-head")))
        await _wait_event(server, "c-head", "request_body_stalled")
        task.cancel()
        await _wait_event(server, "c-head", "connection_closed")
        assert 0 == server.ledger.find(request_id="c-head")["effects"]

    async def test_release_ends_a_delayed_response(self, start) -> None:
        """A delayed response is delivered, complete, when released (POST /_sim/release)."""
        server = await start("late_response_after_commit:op=create_issue")
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
            task = asyncio.ensure_future(client.post("/v1/issues", json={"title": "x"},
                                                     headers={**AUTH, "X-Correlation-Id": "c-late"}))
            await _wait_event(server, "c-late", "response_write_delayed")
            released = await client.post("/_sim/release", headers={"X-Sim-Token": server.sim_token})
            assert 200 == released.status_code
            assert 201 == (await task).status_code
        assert "response_sent" == server.events.snapshot("c-late")[-1]["event"]

    async def test_malformed_http_is_answered_and_survived(self, start) -> None:
        """Garbage gets a 400; the next connection is served normally."""
        server = await start()
        headers, _ = head_and_body(await raw(server, b"NOT HTTP AT ALL\r\n\r\n"))
        assert "400" == headers[":status"]
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
            assert 200 == (await client.get("/v1/issues/ISS-1", headers=AUTH)).status_code


class TestAuth:
    async def test_missing_unknown_and_never_logged(self, start, tmp_path: Path) -> None:
        """No token -> 401 with a challenge; an unknown token -> invalid_token; neither is logged."""
        server = await start()
        stranger = make_canary()
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
            missing = await client.get("/v1/issues/ISS-1")
            unknown = await client.get("/v1/issues/ISS-1", headers={"Authorization": f"Bearer {stranger}"})
            ok = await client.get("/v1/issues/ISS-1", headers=AUTH)
        assert (401, 'Bearer realm="vaultsim"') == (missing.status_code, missing.headers["www-authenticate"])
        assert (401, {"error": "invalid_token"}) == (unknown.status_code, unknown.json())
        assert 200 == ok.status_code
        text = json.dumps(server.events.snapshot()) + (tmp_path / "ev0.jsonl").read_text()
        assert TOKEN not in text and stranger not in text
        assert all(TOKEN not in r.text and stranger not in r.text for r in (missing, unknown, ok))

    async def test_expiry_of_one_named_token(self, start) -> None:
        """expired_token:token=NAME expires only that token, after it was accepted once."""
        server = await start("expired_token:token=tracker_token")
        other = {"Authorization": f"Bearer {TOKEN}-other"}
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
            codes = [(await client.get("/v1/issues/ISS-1", headers=h)).status_code
                     for h in (AUTH, AUTH, other, other)]
        assert [200, 401, 200, 200] == codes


class TestLedgerAndStatus:
    async def test_key_reuse_with_other_body_is_refused(self, start) -> None:
        """The same Idempotency-Key for a different request is a 422, not a replay."""
        server = await start()
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
            h = {**AUTH, "Idempotency-Key": "k1"}
            first = await client.post("/v1/issues", json={"title": "a"}, headers=h)
            replay = await client.post("/v1/issues", json={"title": "a"}, headers=h)
            other = await client.post("/v1/issues", json={"title": "b"}, headers=h)
        assert (201, 201, 422) == (first.status_code, replay.status_code, other.status_code)
        assert first.json() == replay.json()
        entry = server.ledger.find(idempotency_key="k1")
        assert (3, 1) == (entry["attempts"], entry["effects"])

    async def test_a_key_with_spaces_is_a_key(self, start) -> None:
        """A key with a space inside was dropped as no key: the replay filed a second issue, and
        the status endpoint asked by that key said not_seen for a committed create."""
        server = await start()
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
            h = {**AUTH, "Idempotency-Key": "run 1 / agent a / step create"}
            first = await client.post("/v1/issues", json={"title": "a"}, headers=h)
            replay = await client.post("/v1/issues", json={"title": "a"}, headers=h)
            status = await client.get("/v1/operations", headers=AUTH,
                                      params={"idempotency_key": "run 1 / agent a / step create"})
        assert first.json() == replay.json()
        assert ("committed", 1) == (status.json()["state"], status.json()["effects"])

    async def test_status_endpoint_is_not_an_attempt_nor_faulted(self, start) -> None:
        """Lookups are not counted as attempts, and an untargeted fault leaves them alone."""
        server = await start("permission_denied")
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
            status = await client.get("/v1/operations", params={"request_id": "c-x"}, headers=AUTH)
        assert (200, "not_seen") == (status.status_code, status.json()["state"])
        assert 0 == server.ledger.total_attempts()

    async def test_events_file_is_private_json_lines(self, start, tmp_path: Path) -> None:
        """The event file is 0600, one JSON object a line, each with the correlation id."""
        server = await start()
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
            await client.get("/v1/builds/b-101", headers={**AUTH, "X-Correlation-Id": "c-file"})
        path = tmp_path / "ev0.jsonl"
        assert 0o600 == path.stat().st_mode & 0o777
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert ["received", "response_sent"] == [e["event"] for e in lines]
        assert {"c-file"} == {e["correlation_id"] for e in lines}


class TestSimEndpoints:
    def test_thread_runner_and_runtime_fault(self) -> None:
        """RemoteThread serves; /_sim/fault changes the fault; /_sim/ledger and /_sim/state report."""
        with RemoteThread({"tracker_token": TOKEN}) as remote:
            sim = {"X-Sim-Token": remote.server.sim_token}
            with httpx.Client(base_url=remote.url, trust_env=False) as client:
                assert 200 == client.get("/v1/issues/ISS-1", headers=AUTH).status_code
                info = client.post("/_sim/fault", headers=sim,
                                   json={"fault": "rate_limited:retry_after=9"}).json()
                assert "rate_limited" == info["fault"]["name"]
                limited = client.get("/v1/issues/ISS-1", headers=AUTH)
                assert (429, "9") == (limited.status_code, limited.headers["retry-after"])
                assert 400 == client.post("/_sim/fault", headers=sim, json={"fault": "nope"}).status_code
                refused = client.post("/_sim/fault", headers=sim, json={"fault": "connection_refused"}).json()
                assert refused["service_url"] != refused["url"]
                ledger = client.get("/_sim/ledger", headers=sim).json()["operations"]
                assert 2 == sum(e["attempts"] for e in ledger)
                assert "ISS-1" == client.get("/_sim/state", headers=sim).json()["issues"][0]["id"]
                assert client.get("/_sim/events", headers=sim).json()


def _write_creds(path: Path, mode: int) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        json.dump({"tracker_token": TOKEN}, f)
    os.chmod(path, mode)
    return path


class TestProcess:
    def test_subprocess_serves_and_stops_on_sigterm(self, tmp_path: Path) -> None:
        """`python -m vault.remote` prints its URL first, serves, and exits 0 on SIGTERM."""
        creds = _write_creds(tmp_path / "c.json", 0o600)
        proc = subprocess.Popen([sys.executable, "-m", "vault.remote", "--credentials", str(creds),
                                 "--events", str(tmp_path / "ev.jsonl"), "--fault", "permission_denied"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            assert line.startswith("listening on http://127.0.0.1:")
            url = line.split("listening on ", 1)[1].strip()
            assert 403 == httpx.get(f"{url}/v1/issues/ISS-1", headers=AUTH, trust_env=False).status_code
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert 0 == proc.returncode, err
        assert TOKEN not in out + err + (tmp_path / "ev.jsonl").read_text()

    def test_client_side_fault_prints_service_url(self, tmp_path: Path) -> None:
        """Under a client-side fault the second line is the URL to give the vault."""
        creds = _write_creds(tmp_path / "c.json", 0o600)
        proc = subprocess.Popen([sys.executable, "-m", "vault.cli.main", "remote", "--credentials", str(creds),
                                 "--fault", "dns_failure"], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().startswith("listening on ")
            assert "service url http://vaultsim-remote.invalid:80\n" == proc.stdout.readline()
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert 130 == proc.returncode  # Ctrl-C: interrupted, as every command says

    def test_credentials_file_must_be_private(self, tmp_path: Path) -> None:
        """A group/world-readable credentials file is refused (exit 2) without quoting it."""
        creds = _write_creds(tmp_path / "c.json", 0o644)
        with pytest.raises(BadInput):
            load_credentials(creds)
        proc = subprocess.run([sys.executable, "-m", "vault.remote", "--credentials", str(creds)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert 2 == proc.returncode
        assert TOKEN not in proc.stdout + proc.stderr

    @pytest.mark.parametrize("content", [b"\xff\xfe", b"t: " + b"9" * 5000], ids=["not-utf8", "huge-integer"])
    def test_unreadable_credentials_file_is_bad_input(self, tmp_path: Path, content: bytes) -> None:
        creds = tmp_path / "c.json"
        creds.write_bytes(content)
        creds.chmod(0o600)
        with pytest.raises(BadInput) as err:
            load_credentials(creds)
        assert str(creds) in err.value.message


class TestProcessBadInput:
    """`vaultsim remote` started wrongly: exit 2 and one clear line, never a traceback."""

    def _run(self, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
        creds = _write_creds(tmp_path / "c.json", 0o600)
        return subprocess.run([sys.executable, "-m", "vault.remote", "--credentials", str(creds), *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)

    def test_port_in_use(self, tmp_path: Path) -> None:
        import socket
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            proc = self._run(tmp_path, "--port", str(port))
        assert 2 == proc.returncode
        assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "Traceback" not in proc.stderr

    @pytest.mark.parametrize("args, says", [
        (["--port", "70000"], "not a port"),
        (["--events", "/nonexistent-dir/e.jsonl"], "--events: cannot open"),
    ], ids=["port-range", "events-dir"])
    def test_bad_option(self, tmp_path: Path, args: list[str], says: str) -> None:
        proc = self._run(tmp_path, *args)
        assert 2 == proc.returncode
        assert says in proc.stderr and "Traceback" not in proc.stderr


def test_event_log_on_a_full_disk_keeps_events_in_memory(capsys: pytest.CaptureFixture[str]) -> None:
    from vault.remote.ledger import EventLog
    log = EventLog(Path("/dev/full"))
    log.emit("request_received", correlation_id="c-1")
    log.emit("request_received", correlation_id="c-2")
    assert ["c-1", "c-2"] == [e["correlation_id"] for e in log.snapshot()]
    assert 1 == capsys.readouterr().err.count("cannot write the event log")
    log.close()


async def _wait_until(pred, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def _wait_event(server: RemoteServer, cid: str, name: str) -> None:
    await _wait_until(lambda: any(e["event"] == name for e in server.events.snapshot(cid)))
