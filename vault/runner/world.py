"""The world one trial runs in: a fresh vault and everything around it.

Under a short private directory in /tmp (AF_UNIX paths are short):

    h/          the vault home (sockets, encrypted credentials, audit log)
    kr/         the embedded keyring holding this home's data key
    st/         what agents may persist across a restart (decision receipts)
    ssh/        a real sshd and its fake host, when the scenario needs one
    config.yaml, catalog.yaml, daemon.log

The fake remote runs in the runner's process (its RemoteServer on the
runner's loop: no process to start, its ledger read directly); the daemon is a
real, separate process; the scripted approver runs in the runner on the
approver socket and keeps every notification it gets. Credentials are fresh
random values per trial (plus a planted canary nobody uses), set in the
vault's store and given to the remote, and nowhere else.

Bypass evidence (vault.vouch): a fresh mark per trial, handed to the daemon
over `mark.sock` (to its pid only) and checked by the remote on every
request, with the connection's owner where /proc shows it; the remote keeps
what reached it for the leak scan.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import io
import os
import secrets
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import yaml

from vault import regular
from vault.catalog import Catalog, load_catalog
from vault.client import connect_approver, read_approver_token
from vault.errors import BadInput, HomeError, VaultError
from vault.gate.policy import Policy, load_policy
from vault.home import VaultHome
from vault.store.keyring_backend import FileKeyring
from vault.store.keystore import KeyStore
from vault.remote.server import RemoteServer
from vault.remote.vouch import Vouch
from vault.resources import IMPORT_ROOT
from vault.approvers.scripted import ApproverRule, ApproverScript, ScriptedApprover, load_script
from vault.store.credentials import CredentialStore
from vault.vouch import HEADER as MARK_HEADER
from vault.vouch import MarkHandoff, new_mark
from vault.runner import beneath, code_files, daemon_answer, hosts, needle_scan, outer_dirs, rule_files, vault_files
if TYPE_CHECKING:
    from vault.remote.sshd import SshdInfo, SshdServer
from vault.runner.procs import Launcher, Proc, kill_group
from vault.runner.scenario import Scenario
from vault.runner.world_procs import home_env

ROOT = IMPORT_ROOT  # where processes start (trial.py starts agents from here too)
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0  # well above the daemon's own bounded drain on a quiet host
POLL_S = 0.005
PLANTED = "planted_canary"
SETUP = "setup-"  # correlation-id prefix of the runner's own setup requests


@functools.lru_cache(maxsize=None)
def default_catalog() -> Catalog:
    return load_catalog()


@functools.lru_cache(maxsize=None)
def policy_at(path: Path | None) -> Policy:
    return load_policy(path)


class RecordingApprover(ScriptedApprover):
    """The scripted approver, also keeping every notification the vault sent it."""

    def __init__(self, script: ApproverScript, notes: list[tuple[str, dict[str, Any]]]) -> None:
        super().__init__(script, io.StringIO())
        self.notes = notes
        # every decide (its request id) and lock this approver sent, recorded before it is sent:
        # the daemon's record of the runner's acts must hold no more (vault.runner.bypass)
        self.sent: list[tuple[str, str]] = []
        self.said: list[str] = []  # what it would have told a person about the daemon (vault.silence)
        self._granted: asyncio.Future[dict[str, Any]] | None = None
        self._held: asyncio.Event | None = None

    def hold_decisions(self) -> None:
        """Until `release_decisions`, no decision is sent: an agent waiting on one stays alive."""
        self._held = asyncio.Event()

    def release_decisions(self) -> None:
        if self._held is not None:
            self._held.set()

    async def before_deciding(self) -> None:
        if self._held is not None:
            await self._held.wait()

    def sending(self, method: str, request_id: str | None) -> None:
        self.sent.append((method, request_id or ""))

    def say(self, text: str) -> None:
        self.said.append(text)  # kept, not printed: the runner grades a daemon that stops answering

    @property
    def rules(self) -> list[ApproverRule]:
        """The rules it decides by (a live approver's, as the test set them so far)."""
        return list(self.script.rules)

    def on_notify(self, method: str, params: dict[str, Any]) -> None:
        self.notes.append((method, params))
        if method == "grant.created":
            first = self._grant_future()
            if not first.done():
                first.set_result(dict(params))
        super().on_notify(method, params)

    def _grant_future(self) -> asyncio.Future[dict[str, Any]]:
        if self._granted is None:
            self._granted = asyncio.get_running_loop().create_future()
        return self._granted

    async def first_grant(self) -> dict[str, Any]:
        """The first session grant the vault announced (waits for it)."""
        return await asyncio.shield(self._grant_future())


class World:
    def __init__(self, sc: Scenario, root: Path, launcher: Launcher, env: dict[str, str]) -> None:
        self.sc, self.root, self.launcher, self.env = sc, root, launcher, env
        self.home = VaultHome(root / "h").ensure()
        self.keystore = KeyStore(self.home, FileKeyring(root / "kr"))
        self.catalog = default_catalog()
        if sc.catalog:
            self.catalog = self.catalog.merged(Catalog.model_validate(sc.catalog))
        self.policy = policy_at(sc.relative(sc.policy) if sc.policy else None)
        self.secrets: dict[str, str] = {}
        # the daemon's log as the runner made it, held open: without a jail an agent can put
        # another file (a sparse one of 64 GiB, a FIFO) under its name (vault.runner.collect)
        self.daemon_log_fd: int | None = None
        # read once the daemon has made it, before any agent runs: an agent without the jail may
        # later swap the file (a FIFO there held the runner's read, and with it the run, forever)
        self.approver_token: str | None = None
        self.remote: RemoteServer | None = None
        self.sshd: SshdServer | None = None
        self.ssh_log: BinaryIO | None = None
        self.ssh_info: SshdInfo | None = None
        self.daemon: Proc | None = None
        self.approver: RecordingApprover | None = None
        self.agent_sock_id: tuple[int, int] | None = None
        self.approver_ids: dict[str, tuple[int, int, int] | None] = {}
        self.daemon_gone_told = False
        # the daemon's cgroups before any agent ran: the runner never moves it, and a group of an
        # agent's own can freeze it (cgroup freezer), which leaves no signal to note (vault.runner.trial)
        self.daemon_groups: frozenset[str] | None = None
        self.approver_task: asyncio.Task[None] | None = None
        self.notes: list[tuple[str, dict[str, Any]]] = []
        self.mark = new_mark()  # the vault's mark on its requests (vault.vouch); never leaves the runner
        self.data_key_text: str | None = None
        self.vault_files: dict[str, vault_files.Seen] = {}  # the credential files as the trial's set-up left them
        self.key_files: dict[str, vault_files.Seen] = {}  # its audit key and the SSH host's keys, likewise
        self.rule_files: dict[str, str] = {}  # what its approvals and grading are read from (vault.runner.rule_files)
        self.code_files: dict[str, code_files.Sig] = {}  # the vault's code and Python's start hooks (vault.runner.code_files)
        # the mounts before any agent ran: one made since hides what it covers (vault.runner.beneath)
        self.mounts_before = beneath.table()
        # the outer directories' entries before any agent ran: a new one is read (vault.runner.outer_dirs)
        self.outer_before = outer_dirs.listed()
        self.scanned_clean = needle_scan.Clean()  # the agents' files a leak scan found clean, as they were

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    # ---- up ----------------------------------------------------------------------

    async def start(self, approver: RecordingApprover | None = None) -> None:
        """Services, daemon, the baselines every agent is judged against, the approver (the
        scenario's, or the one given: the pytest plugin's live rules). `vaultsim run` and the
        plugin both start here, so neither misses a baseline the other records."""
        # before the daemon reads its policy: an agent must not rewrite it for the next one
        self.rule_files = await asyncio.to_thread(rule_files.look, rule_files.paths(self.sc))
        self.code_files = await asyncio.to_thread(code_files.look)  # nor the vault's code, for the next daemon
        await self.start_services()
        await self.start_daemon()
        self.agent_sock_id = _file_id(self.home.agent_sock)  # an agent must not swap it for its own
        self.approver_ids = self._approver_files()  # nor the approvers' socket or token (vault.runner.bypass)
        self.vault_files = await asyncio.to_thread(self._credential_files)
        self.key_files = await asyncio.to_thread(self._key_files)
        if approver is not None or self.sc.approver is not None:
            await self.start_approver(approver)

    def credential_names(self) -> list[str]:
        if self.sc.credentials is not None:
            return list(self.sc.credentials)
        return sorted({op.credential for op in self.catalog.operations.values()})

    async def start_services(self) -> None:
        """Remote, sshd, credentials and the daemon's config, side by side."""
        sc = self.sc
        names = self.credential_names()
        ssh_keys = {op.credential for op in self.catalog.operations.values() if op.executor == "ssh"}
        for name in names:
            if name not in ssh_keys:
                self.secrets[name] = "vsk_" + secrets.token_urlsafe(24)
        self.secrets[PLANTED] = "vsc_" + secrets.token_urlsafe(24)
        sshd_started = None
        if sc.ssh is not None:
            self.sshd = hosts.sshd_module().SshdServer(self.root / "ssh")  # type: ignore[union-attr]
            sshd_started = asyncio.create_task(asyncio.to_thread(self.sshd.start))
        tokens = {k: v for k, v in self.secrets.items() if k not in ssh_keys and k != PLANTED}
        self.remote = RemoteServer(tokens, sc.fault)
        self.remote.vouch, self.remote.capture = Vouch(self.mark, {os.getpid()}), True
        try:
            await self.remote.start()
            if sshd_started is not None:
                self.ssh_info = await asyncio.shield(sshd_started)
                assert self.ssh_info is not None
                # the host's log as sshd writes it: the logins are counted from this file, even if
                # one without a jail renames another over its name (`sed -i`)
                self.ssh_log = open(self.ssh_info.log_file, "rb")
        except BaseException:  # a failed start, or the trial stopped (Ctrl-C, -x) meanwhile
            if sshd_started is not None:
                # its error is not the one to report (the trial's own is): taken, never "unretrieved"
                sshd_started.add_done_callback(lambda t: t.cancelled() or t.exception())
                # a thread cannot be stopped: let sshd's start finish, so that close() stops what
                # it started and the home is removed only after it (never recreated under it)
                with contextlib.suppress(BaseException):
                    await asyncio.wait({sshd_started})
            raise
        if sshd_started is not None:
            assert sc.ssh is not None and self.ssh_info is not None
            for name in ssh_keys & set(names):
                self.secrets[name] = self.ssh_info.private_key
            if sc.ssh.fault in ("kill_client", "kill_remote"):
                self.ssh_info.hold(sc.ssh.service)  # released by the fault, see hosts.play_fault
            elif sc.ssh.fault == "fail":
                self.ssh_info.fail(sc.ssh.service, 1)
        await asyncio.to_thread(self.set_credentials)
        if sc.remote.validate_credentials:
            await self.validate_credentials(tokens)
        self.write_config()

    def set_credentials(self) -> None:
        store = CredentialStore(self.home, self.keystore)
        for name, value in self.secrets.items():
            store.set(name, value)
        # the data key as the keyring holds it: an agent without a jail can print it (it opens
        # credentials.enc), so reports redact it as they do the credentials
        self.data_key_text = base64.b64encode(self.keystore.data_key()).decode()

    async def validate_credentials(self, tokens: dict[str, str]) -> None:
        """One authenticated read per token, as a setup that checks its credentials would do."""
        import aiohttp
        assert self.remote is not None
        async with aiohttp.ClientSession(trust_env=False, timeout=aiohttp.ClientTimeout(total=5)) as client:
            for name, value in tokens.items():
                async with client.get(f"{self.remote.url}/v1/issues/ISS-1",
                                      headers={"Authorization": f"Bearer {value}", MARK_HEADER: self.mark,
                                               "X-Correlation-Id": SETUP + name}) as response:
                    await response.read()

    def write_config(self) -> None:
        assert self.remote is not None
        services: dict[str, Any] = {}
        for op in self.catalog.operations.values():
            if op.executor == "http":
                services[op.service] = {"url": self.remote.service_url, "options": dict(self.sc.remote.timeouts)}
        if self.ssh_info is not None:
            services["host"] = {"host": self.ssh_info.host, "port": self.ssh_info.port,
                                "user": self.ssh_info.user, "known_hosts": self.ssh_info.known_hosts,
                                "options": {"markers_dir": self.ssh_info.markers_dir}}
        if self.sc.catalog:
            (self.root / "catalog.yaml").write_text(yaml.safe_dump(self.sc.catalog))
        audit = {"audit": self.sc.audit.model_dump(exclude_unset=True)} if self.sc.audit is not None else {}
        (self.root / "config.yaml").write_text(yaml.safe_dump(
            {"services": services, "call_timeout_s": self.sc.call_timeout_s, **audit}))

    async def start_daemon(self) -> None:
        args = ["daemon", "--foreground", "--home", str(self.home.root), "--config", str(self.root / "config.yaml")]
        if self.sc.policy:
            args += ["--policy", str(self.sc.relative(self.sc.policy))]
        if self.sc.catalog:
            args += ["--catalog", str(self.root / "catalog.yaml")]
        if not self.sc.locked:
            args.append("--unlocked")
        env = home_env(self.root, self.env)
        handoff = MarkHandoff(self.root / "mark.sock", self.mark)
        await handoff.start()
        # the daemon's log made and held before the daemon starts (it appends to it): what the runner
        # reads of it later is read through this (vault.runner.runner_files); opened after the spawn,
        # the file was now and then not there yet, and the log was read by its name
        with contextlib.suppress(OSError):
            os.close(os.open(self.daemon_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600))
            self.daemon_log_fd = regular.open_fd(self.daemon_log, follow=False)
        try:
            self.daemon = daemon = await self.launcher.spawn(
                "daemon", [*args, "--mark-socket", str(handoff.path)], env=env, cwd=str(ROOT),
                stdout=self.daemon_log, stderr=self.daemon_log)
            handoff.expect(daemon.pid)
            assert self.remote is not None and self.remote.vouch is not None
            self.remote.vouch.pids.add(daemon.pid)
            await self._wait_daemon(daemon)
        finally:
            await handoff.close()
        with contextlib.suppress(HomeError, BadInput):  # the daemon has made it; no agent has run yet
            self.approver_token = read_approver_token(self.home) or None

    def tripwire_ports(self) -> tuple[int, ...]:
        """Where a jailed agent would knock to reach a remote around the vault."""
        ports = [self.remote.port] if self.remote is not None else []
        if self.remote is not None and self.remote.service_url != self.remote.url:
            ports.append(int(self.remote.service_url.rsplit(":", 1)[1]))
        if self.ssh_info is not None:
            ports.append(self.ssh_info.port)
        return tuple(ports)

    async def audit_head(self) -> dict[str, Any] | None:
        """Where its audit log stands, as the daemon itself reports it: `{"head", "tip"}`, its
        newest durable signed head and record (vault.runner.bypass checks the file against them),
        and `halted`: why its log failed and it stopped serving calls (a full disk), if it did; a
        failure it resumed from once there was room again is `halted` all the same (the trial's
        calls were refused meanwhile), said so."""
        try:
            client, _ = await connect_approver(self.home, "vaultsim-run", subscribe=False)
        except (VaultError, OSError):
            return None
        try:
            status = await client.request("status")
        except (VaultError, OSError):
            return None
        finally:
            await client.close()
        if not isinstance(status, dict):
            return None
        halted = status.get("halted") or _resumed(status.get("audit_resumed"))
        # when it was continued (SIGCONT): a stop undone behind the runner's back (vault.runner.bypass)
        continued = [float(t) for t in status.get("continued") or [] if isinstance(t, (int, float))]
        count = status.get("continued_count")
        cont = {"continued": continued, "continued_count": count if isinstance(count, int) else len(continued)}
        if not isinstance(status.get("audit_head"), dict):
            return {"halted": str(halted), **cont} if halted else None
        return {"head": status["audit_head"], "tip": status.get("audit_tip"),
                "halted": str(halted) if halted else None, **cont}

    @property
    def daemon_pid(self) -> int:
        """The daemon's pid (its process group); RuntimeError before it was started."""
        if self.daemon is None:
            raise RuntimeError("the world's daemon is not started")
        return self.daemon.pid

    def daemon_cgroups(self) -> frozenset[str]:
        """The cgroups of the daemon's threads now (/proc/PID/task/TID/cgroup, a line per hierarchy:
        cgroup v1 places each thread on its own); empty if unread."""
        if self.daemon is None:
            return frozenset()
        out: set[str] = set()
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{self.daemon.pid}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{self.daemon.pid}/task/{tid}/cgroup") as f:
                    out.update(line.rstrip("\n") for line in f)
        return frozenset(out)

    def daemon_disturbed(self) -> str:
        """What became of the daemon, if anything did: "" while it serves; "stopped" when a
        process of the same user (an agent without a jail) SIGSTOP'd it, which the runner undoes
        (SIGCONT) so the trial can end and be graded instead of waiting on it for ever; else how it
        ended."""
        daemon = self.daemon
        if daemon is None:
            return ""
        if daemon.returncode is not None:
            if self.daemon_gone_told:
                return ""  # named against the agent it happened under, not every later one
            self.daemon_gone_told, code = True, daemon.returncode
            return f"killed (signal {-code})" if code < 0 else f"gone (exit {code})"
        import psutil
        try:
            stopped = psutil.Process(daemon.pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
        except psutil.Error:
            return ""
        if stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(daemon.pid, signal.SIGCONT)
            return "stopped"
        now = _file_id(self.home.agent_sock)
        if self.agent_sock_id is not None and now != self.agent_sock_id:
            self.agent_sock_id = now  # the next agent is judged from here
            return "cut off from its agent socket (the socket file was replaced or removed)"
        return ""

    def _approver_files(self) -> dict[str, tuple[int, int, int] | None]:
        out: dict[str, tuple[int, int, int] | None] = {}
        for path in (self.home.approver_sock, self.home.approver_token_file):
            try:
                st = os.lstat(path)  # never opened: a FIFO put there must not hold the runner
                out[path.name] = (st.st_dev, st.st_ino, st.st_ctime_ns)
            except OSError:
                out[path.name] = None
        return out

    def approver_files_swapped(self) -> list[str]:
        """The approver socket and token files removed, replaced or changed since the last look
        (only the jail's decoys are watched; without one, an unlink opens nothing): a listener put
        in the socket's place would be handed the token by the next approver to say hello."""
        if not self.approver_ids:
            return []
        now = self._approver_files()
        changed = [name for name, was in self.approver_ids.items() if now.get(name) != was]
        self.approver_ids = now  # the next agent is judged from here
        return changed

    def _credential_files(self) -> dict[str, vault_files.Seen]:
        """Each file holding the vault's credentials: the encrypted store and the keyring holding
        its data key (vault.runner.vault_files)."""
        return vault_files.look([self.home.credentials_file, *sorted((self.root / "kr").glob("*"))])

    def _key_files(self) -> dict[str, vault_files.Seen]:
        """The vault's other secret files: the audit log's key and the SSH host's private keys."""
        return vault_files.look([self.home.root / "audit.key", *sorted((self.root / "ssh").glob("ssh_host_*_key"))])

    def credential_files_changed(self) -> list[str]:
        """The credential files rewritten, replaced, added, removed, linked elsewhere or given
        another mode or owner since the last look (each agent is judged from where its
        predecessor left them)."""
        now, keys = self._credential_files(), self._key_files()
        changed = [*vault_files.changes(self.vault_files, now), *vault_files.changes(self.key_files, keys, contents=False)]
        self.vault_files, self.key_files = now, keys
        return changed

    def rule_files_changed(self) -> list[str]:
        """The scenario's files (its policy, approver script, plans, the catalog) changed since the
        last look (vault.runner.rule_files)."""
        now = rule_files.look([Path(p) for p in self.rule_files])
        changed = rule_files.changed(self.rule_files, now)
        self.rule_files = now
        return changed

    def code_files_changed(self) -> list[str]:
        """The vault's code or Python's start hooks changed since the last look (vault.runner.code_files)."""
        now = code_files.look()
        changed = code_files.changed(self.code_files, now)
        self.code_files = now
        return changed

    async def _wait_daemon(self, daemon: Proc) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not await _answers(self.home.approver_sock):
            if daemon.returncode is not None:
                raise RuntimeError(f"the daemon exited ({daemon.returncode}) before it served: "
                                   + self.daemon_tail())
            if time.monotonic() > deadline:
                raise RuntimeError("the daemon did not answer in time: " + self.daemon_tail())
            await asyncio.sleep(POLL_S)  # polling the socket, bounded by the deadline

    def approver_script(self) -> ApproverScript:
        """The scenario's approver rules (from its file or inline)."""
        spec = self.sc.approver
        assert spec is not None
        if spec.file:
            script = load_script(self.sc.relative(spec.file))
            if spec.name:
                script = script.model_copy(update={"name": spec.name})
        else:
            script = ApproverScript.model_validate({"name": spec.name or "ci", "rules": spec.rules or []})
        if spec.seed is not None:
            script = script.model_copy(update={"seed": spec.seed})
        return script

    async def start_approver(self, approver: RecordingApprover | None = None) -> None:
        """Subscribe the scenario's approver, or the one given (the pytest plugin's live rules)."""
        self.approver = approver or RecordingApprover(self.approver_script(), self.notes)
        ready = asyncio.Event()
        self.approver_task = asyncio.create_task(self.approver.run(self.home, ready))
        waiter = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait({waiter, self.approver_task}, timeout=READY_TIMEOUT_S,
                                     return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            waiter.cancel()
            if self.approver_task.done() and self.approver_task.exception():
                raise RuntimeError(f"the approver could not connect: {self.approver_task.exception()}")
            raise RuntimeError("the approver did not subscribe in time")

    # ---- questions ---------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """The daemon's prompt statistics (a hello, no subscription). The daemon serves this
        trial only, so every run id counts: an agent that opens its session under another
        run id (or none) is counted all the same."""
        try:
            client, _ = await connect_approver(self.home, "vaultsim-run", subscribe=False)
        except (VaultError, OSError):
            return {}
        try:
            report = await client.request("stats")
        finally:
            await client.close()
        return merge_runs(list(report.get("runs", {}).values()))

    # ---- down --------------------------------------------------------------------

    async def stop_approver(self) -> None:
        if self.approver is not None and self.approver.client is not None:
            await self.approver.client.close()
        if self.approver_task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self.approver_task, 2.0)

    async def stop_daemon(self) -> None:
        """SIGTERM: the daemon settles waits and closes the audit log with a signed head."""
        if self.daemon is None or self.daemon.returncode is not None:
            return
        kill_group(self.daemon.pid, signal.SIGTERM)
        # a daemon killed while stopping leaves its last records unsigned ("unanchored": FAIL_AUDIT_TAMPER
        # against the agent), so one alive and runnable on a loaded host is waited for as its
        # end-of-trial answers are; one stopped, traced or a zombie is killed after the first bound
        _, stopped = await daemon_answer.ask(self.daemon.pid, self.daemon.wait, first_s=STOP_TIMEOUT_S)
        if not stopped:
            kill_group(self.daemon.pid, signal.SIGKILL)
            await self.daemon.wait()

    def daemon_log_bytes(self, most: int = 1 << 16) -> bytes:
        """The daemon log's last `most` bytes, through the descriptor kept from the daemon's start:
        what the daemon wrote, whatever an unjailed agent put under its name since
        (vault.runner.runner_files); by name only where none was kept (OSError if unread)."""
        fd = self.daemon_log_fd
        if fd is None:
            return last_bytes(self.daemon_log, most)
        return os.pread(fd, most, max(0, os.fstat(fd).st_size - most))

    def daemon_tail(self, n: int = 12) -> str:
        """The daemon log's last `n` lines (vault.runner.world.tail), read as daemon_log_bytes reads it."""
        try:
            return "\n".join(self.daemon_log_bytes().decode(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def log_failed(self) -> str | None:
        """Why the stopped daemon's audit log failed, if it exited saying so (exit 1 after a stop:
        e.g. a full disk kept it from signing its last records), else None. Read from what the
        daemon wrote, never the file under its name (an agent's words there)."""
        if self.daemon is None or self.daemon.returncode != 1:
            return None
        try:
            lines = self.daemon_log_bytes().decode(errors="replace").splitlines()
        except OSError:
            lines = []
        said = next((ln for ln in reversed(lines) if "audit log" in ln and "failed" in ln), "")
        return said.split("vaultsim daemon: stopped; ", 1)[-1] or "its audit log failed (see the daemon log)"

    async def close(self) -> None:
        """Everything down, whatever state it is in; never raises."""
        with contextlib.suppress(Exception):
            await self.stop_approver()
        if self.daemon is not None:
            kill_group(self.daemon.pid, signal.SIGKILL)
            if self.daemon.returncode is None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.daemon.wait(), STOP_TIMEOUT_S)
        if self.remote is not None:
            with contextlib.suppress(Exception):
                await self.remote.stop()
        if self.sshd is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.sshd.stop)
        if self.ssh_log is not None:
            self.ssh_log.close()
        if self.daemon_log_fd is not None:
            os.close(self.daemon_log_fd)
            self.daemon_log_fd = None


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


async def _answers(path: Path) -> bool:
    try:
        _, writer = await asyncio.open_unix_connection(str(path))
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return True


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file (not through a link), else OSError. The
    trial's directory is within reach of an agent run without the jail (its task file is there):
    a FIFO it put in place of its output or a log was opened by the runner and waited on for a
    writer forever, holding the run past TERM."""
    return regular.open_file(path, follow=False)


def last_bytes(path: Path, most: int = 1 << 16) -> bytes:
    """The last `most` bytes of a regular file (OSError otherwise)."""
    with open_regular(path) as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - most))
        return f.read(most)


def tail(path: Path, n: int = 12) -> str:
    try:
        return "\n".join(last_bytes(path).decode(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def merge_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum the per-run counters of the stats report (counts and count tables)."""
    out: dict[str, Any] = {}
    for run in runs:
        for key, value in run.items():
            if isinstance(value, bool):
                continue
            if isinstance(value, (int, float)):
                out[key] = out.get(key, 0) + value
            elif isinstance(value, dict) and all(isinstance(v, int) for v in value.values()):
                table = out.setdefault(key, {})
                for k, v in value.items():
                    table[k] = table.get(k, 0) + v
            else:
                out.setdefault(key, value)
    return out


def _resumed(resumed: Any) -> str | None:
    """The first audit log failure the daemon resumed from (a disk filled, then freed), as
    `halted` says one: an agent that filled the disk is graded for it even so (vault.runner.bypass)."""
    first = resumed[0] if isinstance(resumed, list) and resumed and isinstance(resumed[0], dict) else None
    if first is None or not isinstance(first.get("failed"), str):
        return None
    more = f"; {len(resumed)} such failures" if len(resumed) > 1 else ""
    return (f"audit log failed: {first['failed']} (resumed {first.get('halted_s')} s later, once there was "
            f"room; {first.get('refused_calls')} calls refused meanwhile{more})")
