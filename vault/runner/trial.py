"""One trial of one scenario: set up, run the agents, collect the evidence, grade.

Per trial, under a short private directory in /tmp (AF_UNIX paths are short):

    h/          the vault home (sockets, encrypted credentials, audit log)
    kr/         the embedded keyring holding this home's data key
    st/         what agents may persist across a restart (decision receipts)
    ssh/        a real sshd and its fake host, when the scenario needs one
    *.log/out/err, task-N.json, plan-N.yaml, config.yaml

The fake remote runs in this process (its RemoteServer on the runner's loop:
no process to start, its ledger read directly); the daemon and every agent
are real, separate processes; the scripted approver runs in this process on
the approver socket. Credentials are fresh random canaries per trial, set in
the vault's store and given to the remote, and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import io
import json
import os
import secrets
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..catalog import Catalog, load_catalog
from ..client import connect_approver
from ..errors import VaultError
from ..gate.policy import Policy, load_policy
from ..home import VaultHome
from ..keyring_backend import FileKeyring
from ..keystore import KeyStore
from ..remote.server import RemoteServer
from ..scripted_approver import ApproverScript, ScriptedApprover, load_script
from ..store import CredentialStore
from . import hosts
from .evidence import AgentRun, Evidence
from .grade import Context, Grade, grade
from .procs import Launcher, Registry, group_alive, kill_group, remove_dir
from .scenario import Scenario
from .transcript import from_activity, from_audit

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
DEADLINE_GRACE_S = 1.0
POLL_S = 0.005
PLANTED = "planted_canary"
SETUP = "setup-"


@dataclass
class Runtime:
    """What every trial of a run shares."""

    launcher: Launcher
    registry: Registry
    agent_command: list[str] | None = None  # --agent CMD replaces every scenario agent
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class TrialResult:
    scenario: str
    trial: int
    expected: str
    verdict: str
    duration_s: float
    grade: Grade | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == "SKIPPED" or self.verdict == self.expected

    @property
    def false_pass(self) -> bool:
        return bool(self.grade and self.grade.response_only_pass and self.verdict != "PASS")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"trial": self.trial, "verdict": self.verdict, "expected": self.expected,
                               "ok": self.ok, "duration_s": round(self.duration_s, 3)}
        if self.grade is not None:
            out["reasons"] = self.grade.reasons
            out["findings"] = self.grade.findings
            out["claim"] = self.grade.claim
            out["response_only_pass"] = self.grade.response_only_pass
            out["response_only_false_pass"] = self.false_pass
        if self.error:
            out["error"] = self.error
        out.update(self.summary)
        return out


@functools.lru_cache(maxsize=None)
def default_catalog() -> Catalog:
    return load_catalog()


@functools.lru_cache(maxsize=None)
def policy_at(path: Path | None) -> Policy:
    return load_policy(path)


@functools.lru_cache(maxsize=None)
def _plan_file(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text(encoding="utf-8")) or {})


def base_env() -> dict[str, str]:
    """The parent environment minus anything that could point a process at another vault."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VAULTSIM_") and k not in ("PYTHON_KEYRING_BACKEND",)}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


async def run_trial(rt: Runtime, sc: Scenario, number: int) -> TrialResult:
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="vsr-", dir="/tmp"))
    os.chmod(root, 0o700)
    home = VaultHome(root / "h").ensure()
    keystore = KeyStore(home, FileKeyring(root / "kr"))
    rt.registry.add_dir(root, keystore.destroy)
    trial = Trial(rt, sc, number, root, home, keystore)
    try:
        result = await trial.run()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a harness failure is reported per trial, never a crash of the run
        result = TrialResult(sc.id, number, sc.expect.verdict, "ERROR", 0.0,
                             error=trial.redact(f"{type(exc).__name__}: {exc}"))
        result.summary = {"logs": trial.tail_logs()}
    finally:
        await trial.close()
        rt.registry.done_dir(root)
        remove_dir(root, keystore.destroy)
    result.duration_s = time.monotonic() - started
    return result


class RecordingApprover(ScriptedApprover):
    """The scripted approver, also keeping every notification the vault sent it."""

    def __init__(self, script: ApproverScript, notes: list[tuple[str, dict[str, Any]]]) -> None:
        super().__init__(script, io.StringIO())
        self.notes = notes

    def on_notify(self, method: str, params: dict[str, Any]) -> None:
        self.notes.append((method, params))
        super().on_notify(method, params)


class Trial:
    def __init__(self, rt: Runtime, sc: Scenario, number: int, root: Path, home: VaultHome,
                 keystore: KeyStore) -> None:
        self.rt, self.sc, self.number, self.root, self.home, self.keystore = rt, sc, number, root, home, keystore
        self.run_id = f"{sc.id[:40]}-{number}-{secrets.token_hex(3)}"
        self.secrets: dict[str, str] = {}
        self.remote: RemoteServer | None = None
        self.sshd: Any = None
        self.ssh_info: Any = None
        self.daemon: Any = None
        self.approver: RecordingApprover | None = None
        self.approver_task: asyncio.Task[None] | None = None
        self.notes: list[tuple[str, dict[str, Any]]] = []
        self.fault_note = ""
        self.catalog: Catalog = default_catalog()
        self.agent_procs: list[Any] = []
        self._plans: list[dict[str, Any]] | None = None

    # ---- the whole trial ---------------------------------------------------------

    async def run(self) -> TrialResult:
        sc = self.sc
        if sc.ssh is not None and (why := hosts.ssh_unavailable_reason()):
            return TrialResult(sc.id, self.number, sc.expect.verdict, "SKIPPED", 0.0, error=why)
        if sc.catalog:
            self.catalog = self.catalog.merged(Catalog.model_validate(sc.catalog))
        policy = policy_at(sc.relative(sc.policy) if sc.policy else None)
        await self.start_world()
        await self.start_daemon()
        if sc.approver is not None:
            await self.start_approver()
        deadline = time.time() + sc.task.deadline_s
        ev = Evidence(run_id=self.run_id, started=time.time(), deadline=deadline)
        stop_fault = asyncio.Event()
        fault_task = None
        if sc.ssh is not None and sc.ssh.fault in ("kill_client", "kill_remote"):
            fault_task = asyncio.create_task(hosts.play_fault(
                sc.ssh.fault, self.ssh_info, sc.ssh.service, self.daemon.pid, stop_fault))
        try:
            for i, spec in enumerate(sc.agents):
                ev.agents.append(await self.run_agent(i, spec, deadline))
        finally:
            stop_fault.set()
            if fault_task is not None:
                self.fault_note = await fault_task
        ev.stats = await self.stats()
        await self.stop_approver()
        await self.stop_daemon()
        await self.collect(ev)
        operations = sc.task.operations or sorted({s.get("call") for a in self.plans() for s in a.get("steps", [])})
        fault = sc.fault
        ctx = Context(scenario=sc, catalog=self.catalog, policy=policy, operations=operations,
                      retry_after_s=float(fault.params["retry_after"]) if fault and fault.name == "rate_limited"
                      else None)
        g = grade(ev, ctx)
        summary = json.loads(self.redact(json.dumps(ev.summary())))
        if self.fault_note:
            summary["fault_applied"] = self.fault_note
        return TrialResult(sc.id, self.number, sc.expect.verdict, g.verdict, 0.0, grade=_redacted(g, self),
                           summary=summary)

    # ---- setup -------------------------------------------------------------------

    def credential_names(self) -> list[str]:
        names = self.sc.credentials if self.sc.credentials is not None else sorted(
            {op.credential for op in self.catalog.operations.values()})
        return list(names)

    async def start_world(self) -> None:
        """Remote, sshd, credentials and the daemon's config, side by side."""
        sc = self.sc
        names = self.credential_names()
        ssh_key_names = {op.credential for op in self.catalog.operations.values() if op.executor == "ssh"}
        for name in names:
            if name not in ssh_key_names:
                self.secrets[name] = "vsk_" + secrets.token_urlsafe(24)
        self.secrets[PLANTED] = "vsc_" + secrets.token_urlsafe(24)
        sshd_task = None
        if sc.ssh is not None:
            mod = hosts.sshd_module()
            self.sshd = mod.SshdServer(self.root / "ssh")  # type: ignore[union-attr]
            sshd_task = asyncio.create_task(asyncio.to_thread(self.sshd.start))
        http_tokens = {k: v for k, v in self.secrets.items() if k not in ssh_key_names and k != PLANTED}
        self.remote = RemoteServer(http_tokens, sc.fault)
        await self.remote.start()
        if sshd_task is not None:
            self.ssh_info = await sshd_task
            for name in ssh_key_names & set(names):
                self.secrets[name] = self.ssh_info.private_key
            if sc.ssh.fault in ("kill_client", "kill_remote"):  # type: ignore[union-attr]
                self.ssh_info.hold(sc.ssh.service)  # type: ignore[union-attr]
            elif sc.ssh.fault == "fail":  # type: ignore[union-attr]
                self.ssh_info.fail(sc.ssh.service, 1)  # type: ignore[union-attr]
        await asyncio.to_thread(self.set_credentials)
        if sc.remote.validate_credentials:
            await self.validate_credentials(http_tokens)
        self.write_config()

    def set_credentials(self) -> None:
        store = CredentialStore(self.home, self.keystore)
        for name, value in self.secrets.items():
            store.set(name, value)

    async def validate_credentials(self, tokens: dict[str, str]) -> None:
        """One authenticated read per token, as a setup that checks its credentials would do."""
        import httpx
        assert self.remote is not None
        async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
            for name, value in tokens.items():
                await client.get(f"{self.remote.url}/v1/issues/ISS-1",
                                 headers={"Authorization": f"Bearer {value}", "X-Correlation-Id": f"{SETUP}{name}"})

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
        config = {"services": services, "call_timeout_s": self.sc.call_timeout_s}
        if self.sc.catalog:
            (self.root / "catalog.yaml").write_text(yaml.safe_dump(self.sc.catalog))
        (self.root / "config.yaml").write_text(yaml.safe_dump(config))

    def daemon_env(self) -> dict[str, str]:
        return {**self.rt.env, "VAULTSIM_HOME": str(self.home.root),
                "VAULTSIM_KEYRING_DIR": str(self.root / "kr"),
                "PYTHON_KEYRING_BACKEND": "vault.keyring_backend.FileKeyring"}

    async def start_daemon(self) -> None:
        args = ["daemon", "--foreground", "--home", str(self.home.root), "--config", str(self.root / "config.yaml")]
        if self.sc.policy:
            args += ["--policy", str(self.sc.relative(self.sc.policy))]
        if self.sc.catalog:
            args += ["--catalog", str(self.root / "catalog.yaml")]
        if not self.sc.locked:
            args.append("--unlocked")
        log = self.root / "daemon.log"
        self.daemon = await self.rt.launcher.spawn("daemon", args, env=self.daemon_env(), cwd=str(ROOT),
                                                   stdout=log, stderr=log)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not await _answers(self.home.approver_sock):
            if self.daemon.returncode is not None:
                raise RuntimeError(f"the daemon exited ({self.daemon.returncode}) before it served: "
                                   + _tail(log))
            if time.monotonic() > deadline:
                raise RuntimeError("the daemon did not answer in time: " + _tail(log))
            await asyncio.sleep(POLL_S)  # polling the socket, bounded by the deadline

    async def start_approver(self) -> None:
        spec = self.sc.approver
        assert spec is not None
        if spec.file:
            script = load_script(self.sc.relative(spec.file))
            if spec.name:
                script = script.model_copy(update={"name": spec.name})
        else:
            script = ApproverScript.model_validate({"name": spec.name or "ci", "rules": spec.rules or []})
        self.approver = RecordingApprover(script, self.notes)
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

    # ---- agents ------------------------------------------------------------------

    def plans(self) -> list[dict[str, Any]]:
        if self._plans is not None:
            return self._plans
        out = []
        for spec in self.sc.agents:
            if spec.plan is None:
                out.append({})
                continue
            plan = copy.deepcopy(spec.plan if isinstance(spec.plan, dict) else _plan_file(self.sc.relative(spec.plan)))
            if spec.recovery:
                plan["recovery"] = spec.recovery
            if spec.name:
                plan["agent"] = spec.name
            out.append(plan)
        self._plans = out
        return out

    async def run_agent(self, index: int, spec: Any, deadline: float) -> AgentRun:
        plan = self.plans()[index]
        name = spec.name or plan.get("agent") or "agent"
        state = self.root / "st" / (name if spec.state == "keep" else f"{name}-{index}")
        state.mkdir(mode=0o700, parents=True, exist_ok=True)
        plan_file = self.root / f"plan-{index}.yaml"
        plan_file.write_text(yaml.safe_dump(plan))
        operations = self.sc.task.operations or sorted({s.get("call") for s in plan.get("steps", [])})
        task = {"goal": self.sc.task.goal or self.sc.title, "operations": operations, "deadline": deadline,
                "deadline_s": self.sc.task.deadline_s, "state_dir": str(state), "plan": str(plan_file),
                "steps": plan.get("steps", []), "run_id": self.run_id, "agent_index": index}
        task_file = self.root / f"task-{index}.json"
        task_file.write_text(json.dumps(task))
        env = {**self.rt.env, "VAULTSIM_SOCKET": str(self.home.agent_sock), "VAULTSIM_TASK": str(task_file),
               "VAULTSIM_RUN_ID": self.run_id}
        for var, cred in spec.credential_env.items():
            env[var] = self.secrets.get(cred, "")
        if self.rt.agent_command is not None:
            kind, args = "exec", [a.replace("{python}", sys.executable) for a in self.rt.agent_command]
        elif spec.command is not None:
            words = shlex.split(spec.command) if isinstance(spec.command, str) else list(spec.command)
            kind, args = "exec", [w.replace("{python}", sys.executable) for w in words]
        else:
            kind, args = "agent_stub", ["--plan", str(plan_file)]
        out, err = self.root / f"agent-{index}.out", self.root / f"agent-{index}.err"
        started = time.time()
        proc = await self.rt.launcher.spawn(kind, args, env=env, cwd=str(ROOT), stdout=out, stderr=err)
        self.agent_procs.append(proc)
        killed = False
        try:
            await asyncio.wait_for(proc.wait(), timeout=max(0.1, deadline + DEADLINE_GRACE_S - time.time()))
        except TimeoutError:
            killed = True
            kill_group(proc.pid, signal.SIGKILL)
            await proc.wait()
        ended = time.time()
        kill_group(proc.pid, signal.SIGKILL)  # whatever it left behind (a forked child) ends with it
        self.rt.registry.done_group(proc.pid)
        return AgentRun(index=index, name=str(name), command=" ".join([kind, *args])[:200], pid=proc.pid,
                        started=started, ended=ended, exit_code=proc.returncode, killed_at_deadline=killed,
                        stdout=out.read_text(errors="replace") if out.exists() else "",
                        stderr=err.read_text(errors="replace") if err.exists() else "")

    # ---- evidence ----------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        try:
            client, _ = await connect_approver(self.home, "vaultsim-run", subscribe=False)
        except (VaultError, OSError):
            return {}
        try:
            report = await client.request("stats", run_id=self.run_id)
        finally:
            await client.close()
        return dict(report.get("runs", {}).get(self.run_id, {}))

    async def stop_approver(self) -> None:
        if self.approver is not None and self.approver.client is not None:
            await self.approver.client.close()
        if self.approver_task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self.approver_task, 2.0)

    async def stop_daemon(self) -> None:
        """SIGTERM: the daemon settles waits, closes the audit log with a signed head."""
        if self.daemon is None or self.daemon.returncode is not None:
            return
        kill_group(self.daemon.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.daemon.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            kill_group(self.daemon.pid, signal.SIGKILL)
            await self.daemon.wait()

    async def collect(self, ev: Evidence) -> None:
        assert self.remote is not None
        if self.ssh_info is not None:
            await hosts.wait_host_quiet(self.ssh_info)
            ev.ssh = hosts.host_state(self.ssh_info)
        # the setup's own credential checks are not the agent's attempts
        ev.ledger = [e for e in self.remote.ledger.snapshot()
                     if not all(str(r).startswith(SETUP) for r in e.get("request_ids") or ["-"])]
        ev.remote_events = [e for e in self.remote.events.snapshot()
                            if not str(e.get("correlation_id", "")).startswith(SETUP)]
        ev.remote_state = self.remote.store.snapshot()
        pids = {a.pid: a.index for a in ev.agents}
        windows = [(a.started, a.ended) for a in ev.agents]
        audit_events = self.read_audit(ev)
        if audit_events is not None:
            ev.transcript = from_audit(audit_events, pids, windows)
        else:
            ev.transcript = from_activity(self.notes, ev.remote_events, pids, windows)  # type: ignore[arg-type]
        ev.secrets = dict(self.secrets)
        with contextlib.suppress(OSError):
            ev.secrets["approver token"] = self.home.approver_token_file.read_text().strip()
        visible: dict[str, bytes] = {}
        for a in ev.agents:
            visible[f"agent {a.index} stdout"] = a.stdout.encode()
            visible[f"agent {a.index} stderr"] = a.stderr.encode()
        visible["the transcript"] = json.dumps(audit_events or [], default=str).encode()
        visible["the approver's notifications"] = json.dumps(self.notes, default=str).encode()
        visible["the remote's event log"] = json.dumps(ev.remote_events, default=str).encode()
        for name, path in (("the raw audit log", self.home.audit_log), ("the daemon log", self.root / "daemon.log")):
            with contextlib.suppress(OSError):
                visible[name] = path.read_bytes()
        for path in sorted(self.root.glob("task-*.json")) + sorted(self.root.glob("plan-*.yaml")):
            visible[f"the agent's {path.name}"] = path.read_bytes()
        for path in (self.root / "st").rglob("*"):
            if path.is_file():
                visible[f"agent state {path.name}"] = path.read_bytes()
        ev.visible = visible

    def read_audit(self, ev: Evidence) -> list[dict[str, Any]] | None:
        log = self.home.audit_log
        if not log.exists():
            ev.audit_status, ev.audit_message = "missing", "the daemon kept no audit log"
            return None
        try:
            from ..audit import decrypt_events, verify
        except ImportError:
            ev.audit_status, ev.audit_message = "unavailable", "vault.audit cannot be imported"
            return None
        try:
            report = verify(log)
            ev.audit_status, ev.audit_message = report.status, report.message
        except VaultError as exc:
            ev.audit_status, ev.audit_message = "unverifiable", exc.message
        try:
            return decrypt_events(log, self.keystore.derive("audit", create=False))
        except VaultError as exc:
            ev.errors.append(f"audit log unreadable: {exc.message}")
            return None

    # ---- teardown ----------------------------------------------------------------

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.stop_approver()
        for proc in [*self.agent_procs, self.daemon]:
            if proc is not None:
                kill_group(proc.pid, signal.SIGKILL)
                self.rt.registry.done_group(proc.pid)
                if proc.returncode is None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
        if self.remote is not None:
            with contextlib.suppress(Exception):
                await self.remote.stop()
        if self.sshd is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.sshd.stop)

    def redact(self, text: str) -> str:
        for value in self.secrets.values():
            for needle in [value.strip(), *(ln.strip() for ln in value.splitlines() if len(ln.strip()) >= 16)]:
                if needle:
                    text = text.replace(needle, "[redacted]")
        return text

    def tail_logs(self) -> dict[str, str]:
        out = {}
        for path in [self.root / "daemon.log", *sorted(self.root.glob("agent-*.err"))]:
            if path.exists():
                out[path.name] = self.redact(_tail(path))
        return out


def _redacted(g: Grade, trial: Trial) -> Grade:
    g.findings = {k: [trial.redact(x) for x in v] for k, v in g.findings.items()}
    return g


async def _answers(path: Path) -> bool:
    try:
        _, writer = await asyncio.open_unix_connection(str(path))
    except (FileNotFoundError, ConnectionRefusedError, OSError):
        return False
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return True


def _tail(path: Path, n: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def live_groups(rt: Runtime) -> list[int]:
    return [pid for pid in rt.registry.groups if group_alive(pid)]
