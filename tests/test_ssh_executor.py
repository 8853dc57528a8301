"""SshExecutor against a real sshd: what the agent is told matches what the host did."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import time
from pathlib import Path

import psutil
import pytest

from vault.catalog import load_catalog
from vault.executors.base import CallContext, ExecOutcome, ServiceConfig
from vault.executors.ssh import SshExecutor
from vault.models import Category, Retry
from vault.remote.sshd import SshdInfo, SshdServer, new_client_key, refused_port, sshd_available
from vault.store.secret import Secret

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.skipif(not sshd_available(), reason="OpenSSH server (/usr/sbin/sshd) not installed"),
]

OP = load_catalog().get("restart_service")
POLL = 0.02


# -- fixtures and helpers ---------------------------------------------------------


@pytest.fixture
def sshd(tmp_path: Path):
    server = SshdServer(tmp_path / "sshd")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def info(sshd: SshdServer) -> SshdInfo:
    assert sshd.info is not None
    return sshd.info


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir(mode=0o700)
    return d


def service(info: SshdInfo, **changes: object) -> ServiceConfig:
    fields: dict[str, object] = {"name": "host", **info.service_fields()}
    fields.update(changes)
    return ServiceConfig(**fields)  # type: ignore[arg-type]


def context(cid: str, workdir: Path | None, *, key: str | None = None, within: float = 30.0) -> CallContext:
    return CallContext(
        correlation_id=cid, session_id="s-test", idempotency_key=key,
        deadline=time.monotonic() + within, workdir=str(workdir) if workdir else None,
    )


async def wait_until(predicate, what: str, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL)


def marker(info: SshdInfo, op_id: str, kind: str) -> Path:
    return Path(info.markers_dir) / f"{op_id}.{kind}"


def start_fields(info: SshdInfo, op_id: str) -> dict[str, str]:
    text = marker(info, op_id, "start").read_text()
    return dict(line.split("=", 1) for line in text.splitlines())


def key_fragments(private_key: str) -> list[str]:
    """The whole key and every base64 body line: none may appear anywhere visible."""
    body = [ln for ln in private_key.splitlines() if ln and not ln.startswith("-----")]
    return [private_key.strip(), "".join(body), *body]


def assert_no_key(outcome: ExecOutcome, private_key: str) -> None:
    visible = outcome.result.to_json() + json.dumps(outcome.diagnostic, default=str) + repr(outcome)
    for fragment in key_fragments(private_key):
        assert fragment not in visible


async def lookup(executor: SshExecutor, info: SshdInfo, cid: str | None, workdir: Path,
                 key: str | None = None) -> ExecOutcome:
    return await executor.lookup(
        OP, Secret(info.private_key), service(info), context("c-lookup", workdir),
        correlation_id=cid, idempotency_key=key,
    )


class Spawned:
    """on_spawn hook: remembers each client process and checks its key file."""

    def __init__(self, private_key: str) -> None:
        self.private_key = private_key
        self.procs: list[asyncio.subprocess.Process] = []
        self.key_paths: list[str] = []

    def __call__(self, proc: asyncio.subprocess.Process, purpose: str) -> None:
        argv = psutil.Process(proc.pid).cmdline()
        if not argv:
            # under load a short client (a lookup) can exit before this hook runs: a zombie shows
            # no command line, so check the argv it was started with instead
            argv = list(proc._transport.get_extra_info("subprocess").args)  # type: ignore[attr-defined]
        for fragment in key_fragments(self.private_key):
            assert all(fragment not in arg for arg in argv)
        key_path = argv[argv.index("-i") + 1]
        st = os.stat(key_path)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(key_path)).st_mode) == 0o700
        assert self.private_key.strip() == Path(key_path).read_text().strip()
        self.procs.append(proc)
        self.key_paths.append(key_path)


# -- outcomes with evidence in hand ------------------------------------------------


class TestCompleted:
    async def test_success_restarts_once_and_leaves_markers(self, info: SshdInfo, workdir: Path) -> None:
        """A completed restart is success, ran exactly once, and lookup finds it."""
        executor = SshExecutor()
        out = await executor.execute(OP, {"service_name": "web"}, Secret(info.private_key),
                                     service(info), context("c-ok1", workdir))
        assert Category.success == out.result.category
        assert {"exit_status": 0} == out.result.data
        assert out.remote_touched
        assert ["web"] == info.restarts()
        assert marker(info, "c-ok1", "start").exists()
        assert "exit_status=0" in marker(info, "c-ok1", "done").read_text()
        assert [] == os.listdir(workdir)
        assert_no_key(out, info.private_key)

        found = await lookup(executor, info, "c-ok1", workdir)
        assert ("found", Category.success) == (found.result.reconciled, found.result.category)
        assert {"state": "completed", "exit_status": 0} == found.result.data
        assert_no_key(found, info.private_key)

    async def test_nonzero_exit_is_confirmed_failure(self, info: SshdInfo, workdir: Path) -> None:
        """A command that ran and exited non-zero is a confirmed failure with its status."""
        info.fail("db", 3)
        executor = SshExecutor()
        out = await executor.execute(OP, {"service_name": "db"}, Secret(info.private_key),
                                     service(info), context("c-fail1", workdir))
        assert Category.confirmed_failure == out.result.category
        assert Retry.bounded == out.result.retry
        assert {"exit_status": 3} == out.result.data
        assert [] == info.restarts()
        assert "exit_status=3" in marker(info, "c-fail1", "done").read_text()

        found = await lookup(executor, info, "c-fail1", workdir)
        assert "found" == found.result.reconciled
        assert {"state": "completed", "exit_status": 3} == found.result.data

    async def test_same_idempotency_key_never_runs_twice(self, info: SshdInfo, workdir: Path) -> None:
        """A retry under the same idempotency key replays the recorded outcome instead of rerunning."""
        executor = SshExecutor()
        first = await executor.execute(OP, {"service_name": "web"}, Secret(info.private_key),
                                       service(info), context("c-idem1", workdir, key="restart web #1"))
        second = await executor.execute(OP, {"service_name": "web"}, Secret(info.private_key),
                                        service(info), context("c-idem2", workdir, key="restart web #1"))
        assert Category.success == first.result.category
        assert Category.success == second.result.category
        assert {"exit_status": 0, "replayed": True} == second.result.data
        assert ["web"] == info.restarts()
        # either call's correlation id, or the key, finds the one operation
        for cid, key in (("c-idem1", None), ("c-idem2", None), (None, "restart web #1")):
            found = await lookup(executor, info, cid, workdir, key=key)
            assert "found" == found.result.reconciled

    async def test_lookup_of_unknown_operation_is_not_found(self, info: SshdInfo, workdir: Path) -> None:
        """No start marker means nothing ran."""
        found = await lookup(SshExecutor(), info, "c-never", workdir)
        assert ("not_found", Category.success) == (found.result.reconciled, found.result.category)
        assert {"state": "not_started"} == found.result.data


# -- failures before the command left ------------------------------------------------


class TestBeforeCommand:
    async def test_wrong_key_is_authentication_failed(self, info: SshdInfo, workdir: Path) -> None:
        """A key the host does not accept is an authentication failure; nothing ran."""
        other_key, _ = new_client_key()
        out = await SshExecutor().execute(OP, {"service_name": "web"}, Secret(other_key),
                                          service(info), context("c-auth1", workdir))
        assert Category.authentication_failed == out.result.category
        assert Retry.never == out.result.retry
        assert not out.remote_touched
        assert [] == info.restarts()
        assert not marker(info, "c-auth1", "start").exists()
        assert [] == os.listdir(workdir)
        assert_no_key(out, other_key)

    async def test_refused_port_is_local_failure(self, info: SshdInfo, workdir: Path) -> None:
        """Nothing listening: a local failure, bounded retry, remote untouched."""
        out = await SshExecutor().execute(OP, {"service_name": "web"}, Secret(info.private_key),
                                          service(info, port=refused_port()), context("c-ref1", workdir))
        assert Category.local_failure == out.result.category
        assert Retry.bounded == out.result.retry
        assert not out.remote_touched
        assert any("Connection refused" in line for line in out.diagnostic["stderr_tail"])
        assert [] == os.listdir(workdir)

    async def test_host_key_mismatch_is_local_failure(self, info: SshdInfo, workdir: Path,
                                                      tmp_path: Path) -> None:
        """A host whose key is not the pinned one is never talked to past the handshake."""
        wrong = tmp_path / "wrong_known_hosts"
        _, other_pub = new_client_key()
        wrong.write_text(f"[{info.host}]:{info.port} {other_pub}\n")
        out = await SshExecutor().execute(OP, {"service_name": "web"}, Secret(info.private_key),
                                          service(info, known_hosts=str(wrong)), context("c-hk1", workdir))
        assert Category.local_failure == out.result.category
        assert not out.remote_touched
        assert [] == info.restarts()

    async def test_missing_known_hosts_refuses_to_connect(self, info: SshdInfo, workdir: Path) -> None:
        """Without a pinned host key the executor does not even start ssh."""
        spawned = Spawned(info.private_key)
        out = await SshExecutor(on_spawn=spawned).execute(
            OP, {"service_name": "web"}, Secret(info.private_key),
            service(info, known_hosts=None), context("c-nokh", workdir))
        assert Category.local_failure == out.result.category
        assert [] == spawned.procs

    async def test_failed_lookup_leaves_the_effect_unknown(self, info: SshdInfo, workdir: Path) -> None:
        """A lookup that cannot ask the host fails as itself and never claims not_found."""
        other_key, _ = new_client_key()
        executor = SshExecutor()
        refused = await executor.lookup(OP, Secret(info.private_key), service(info, port=refused_port()),
                                        context("c-l1", workdir), correlation_id="c-x", idempotency_key=None)
        denied = await executor.lookup(OP, Secret(other_key), service(info),
                                       context("c-l2", workdir), correlation_id="c-x", idempotency_key=None)
        assert (Category.local_failure, "unknown") == (refused.result.category, refused.result.reconciled)
        assert (Category.authentication_failed, "unknown") == (denied.result.category, denied.result.reconciled)
        assert_no_key(denied, other_key)

    @pytest.mark.parametrize("value", ["web; rm -rf /", "..", "../etc", "-rf", "", "web\nreboot"],
                             ids=["shell", "dots", "path", "option", "empty", "newline"])
    async def test_bad_parameter_is_refused_before_spawning(self, info: SshdInfo, workdir: Path,
                                                             value: str) -> None:
        """A parameter outside its pattern, or one that names a path or an option, is a
        local_failure naming it; no ssh client is spawned, no key file written, nothing runs."""
        spawned: list[object] = []
        out = await SshExecutor(on_spawn=lambda proc, purpose: spawned.append(proc)).execute(
            OP, {"service_name": value}, Secret(info.private_key), service(info), context("c-bad", workdir))
        assert (Category.local_failure, False) == (out.result.category, out.remote_touched)
        assert "parameter 'service_name'" in out.result.message
        assert [] == spawned and [] == os.listdir(workdir)
        assert not marker(info, "c-bad", "start").exists()
        assert_no_key(out, info.private_key)


# -- interrupted after the command started (the article's C06 case) ------------------


class TestInterrupted:
    async def test_client_killed_remote_completes(self, info: SshdInfo, workdir: Path) -> None:
        """Variant 1: the local ssh dies after the start marker; the host still finishes, once."""
        spawned = Spawned(info.private_key)
        executor = SshExecutor(on_spawn=spawned)
        info.hold("web")
        call = asyncio.create_task(executor.execute(
            OP, {"service_name": "web"}, Secret(info.private_key), service(info), context("c-v1", workdir)))
        await wait_until(marker(info, "c-v1", "start").exists, "start marker")

        # while the call stalls, its key is a 0600 file in the private workdir
        [key_file] = os.listdir(workdir)
        assert 0o600 == stat.S_IMODE(os.stat(workdir / key_file).st_mode)

        running = await lookup(executor, info, "c-v1", workdir)
        assert "unknown" == running.result.reconciled
        assert {"state": "in_progress"} == running.result.data

        spawned.procs[0].send_signal(signal.SIGKILL)
        out = await call
        assert Category.outcome_unknown == out.result.category
        assert Retry.reconcile_first == out.result.retry
        assert out.remote_touched
        assert signal.SIGKILL == out.diagnostic["ssh_killed_by_signal"]
        assert [] == os.listdir(workdir)
        assert_no_key(out, info.private_key)

        info.release("web")
        await wait_until(marker(info, "c-v1", "done").exists, "completion marker")
        found = await lookup(executor, info, "c-v1", workdir)
        assert "found" == found.result.reconciled
        assert {"state": "completed", "exit_status": 0} == found.result.data
        assert ["web"] == info.restarts()

    @pytest.mark.parametrize("kill_wrapper", [False, True], ids=["command-only", "command-and-wrapper"])
    async def test_remote_killed_after_start(self, info: SshdInfo, workdir: Path, kill_wrapper: bool) -> None:
        """Variant 2: the host kills the command after its start marker; the effect stays unknown."""
        executor = SshExecutor()
        info.hold("web")
        cid = f"c-v2-{int(kill_wrapper)}"
        call = asyncio.create_task(executor.execute(
            OP, {"service_name": "web"}, Secret(info.private_key), service(info), context(cid, workdir)))
        await wait_until(marker(info, cid, "start").exists, "start marker")

        worker = psutil.Process(int(start_fields(info, cid)["pid"]))
        wrapper = psutil.Process(worker.ppid())
        if kill_wrapper:
            wrapper.kill()
        os.killpg(worker.pid, signal.SIGKILL)  # the worker leads its own session and group
        out = await call
        assert Category.outcome_unknown == out.result.category
        assert Retry.reconcile_first == out.result.retry
        assert out.remote_touched

        def worker_gone() -> bool:
            try:
                return worker.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        await wait_until(worker_gone, "worker to die")
        found = await lookup(executor, info, cid, workdir)
        assert "unknown" == found.result.reconciled
        assert {"state": "interrupted"} == found.result.data
        assert "did not complete" in found.result.message
        assert not marker(info, cid, "done").exists()
        assert [] == info.restarts()
        assert_no_key(out, info.private_key)

    async def test_deadline_after_start_is_outcome_unknown(self, info: SshdInfo, workdir: Path) -> None:
        """A call whose deadline passes while the host works reports unknown, not failure."""
        info.hold("web")
        out = await SshExecutor().execute(OP, {"service_name": "web"}, Secret(info.private_key),
                                          service(info), context("c-dl", workdir, within=4.0))
        assert Category.outcome_unknown == out.result.category
        assert out.diagnostic["timed_out"]
        assert marker(info, "c-dl", "start").exists()
        assert [] == os.listdir(workdir)


# -- the key file and the fixture itself ---------------------------------------------


class TestKeyHandling:
    async def test_own_tmpdir_when_no_workdir(self, info: SshdInfo) -> None:
        """Without a workdir the key lives 0600 in a private tmp dir that is removed after."""
        spawned = Spawned(info.private_key)
        out = await SshExecutor(on_spawn=spawned).execute(
            OP, {"service_name": "web"}, Secret(info.private_key), service(info), context("c-nowd", None))
        assert Category.success == out.result.category
        [key_path] = spawned.key_paths
        assert not os.path.exists(key_path)
        assert not os.path.exists(os.path.dirname(key_path))

    async def test_unwritable_workdir_is_local_failure(self, info: SshdInfo, tmp_path: Path) -> None:
        """If the key file cannot be written nothing is attempted and nothing leaks."""
        out = await SshExecutor().execute(OP, {"service_name": "web"}, Secret(info.private_key),
                                          service(info), context("c-nowr", tmp_path / "missing"))
        assert Category.local_failure == out.result.category
        assert not out.remote_touched
        assert_no_key(out, info.private_key)


class TestSshdServer:
    async def test_stop_kills_detached_remote_work(self, sshd: SshdServer, workdir: Path) -> None:
        """Work that detached itself on the host is still killed when the server stops."""
        info = sshd.info
        assert info is not None
        info.hold("web")
        call = asyncio.create_task(SshExecutor().execute(
            OP, {"service_name": "web"}, Secret(info.private_key), service(info), context("c-stop", workdir)))
        await wait_until(marker(info, "c-stop", "start").exists, "start marker")
        worker = psutil.Process(int(start_fields(info, "c-stop")["pid"]))
        assert worker in sshd.session_processes()
        sshd.stop()
        out = await call
        assert Category.outcome_unknown == out.result.category
        assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
