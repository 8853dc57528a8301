"""The runner's world, driven from synchronous code: one world for the runner, tests and the plugin.

`vaultsim run` drives `World` and `Trial` on its own event loop. A pytest test
is synchronous, so this module puts the same two on a loop in a background
thread and answers synchronously:

    Engine      one loop thread, one process registry and one launcher (the fork
                server: daemon and agent_stub forked pre-imported, anything else
                exec'd), shared by every world it starts (pytest: per session)
    LiveWorld   one World (fresh home, embedded keyring, fake remote with its
                fault, daemon with its policy and catalog) and one Trial on it:
                agents run one after another, as in a scenario, until `grade()`
                ends the world through `Trial.conclude`, as every trial ends
    LiveApprover the scripted approver with rules a test sets while it runs

Nothing is re-implemented: setting up is `World.start`, running an agent is
`Trial.run_agent`, grading is `Trial.conclude` (so the verdicts are those of
`vaultsim run`), and tearing down is `Trial.close` plus the registry's reap.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import fnmatch
import os
import shutil
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from vault.catalog import format_validation_error
from vault.errors import BadInput
from vault.approvers.scripted import ApproverRule, ApproverScript
from vault.wire import ApprovalRequested
from vault.remote.vouch import Vouch
from vault.runner import foreign_sessions, gone_answers, own_clients, shared_dirs
from vault.lineage import started
from vault.runner.collect import read_audit
from vault.runner.evidence import AgentRun, Evidence
from vault.runner import neighbour_state
from vault.runner.procs import ExecLauncher, Launcher, Registry, remove_dir
from vault.runner.scenario import AgentSpec, Case, Expect, Scenario, TaskSpec, check_scenario
from vault.runner.transcript import Transcript, from_audit
from vault.runner.trial import Runtime, Trial, TrialResult, base_env
from vault.runner.world import SETUP, RecordingApprover, World

if TYPE_CHECKING:
    from vault.runner.forkserver import ForkServer

T = TypeVar("T")
CALL_TIMEOUT_S = 120.0


class Engine:
    """A background event loop and the launchers every world of a test session shares."""

    def __init__(self, *, fork_server: bool = True) -> None:
        self.registry = Registry()
        self.env = base_env()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="vaultsim-engine", daemon=True)
        self._thread.start()
        self.launcher: Launcher = ExecLauncher(self.registry)
        self._server: ForkServer | None = None
        if fork_server:
            from vault.runner.forkserver import ForkServer
            server = ForkServer(self.registry, self.launcher)
            try:
                server.launch(self.env)
                self.call(server.connect())
                self.launcher = self._server = server
            except OSError:
                server.kill()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT_S) -> T:
        """Run `coro` on the engine's loop and wait for its answer."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def runtime(self) -> Runtime:
        return Runtime(launcher=self.launcher, registry=self.registry, env=dict(self.env))

    def close(self) -> None:
        """Every process and home this engine started ends; the loop stops."""
        if self.loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self.call(self.launcher.aclose(), timeout=10)
        if self._server is not None:
            self._server.kill()
        self.registry.reap()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        with contextlib.suppress(RuntimeError):
            self.loop.close()


class LiveApprover(RecordingApprover):
    """The scripted approver of `vaultsim approve`, with rules the test changes as it goes.

    First matching rule wins, in the order they were added; a request no rule
    matches is denied, as with `vaultsim approve`."""

    def __init__(self, name: str, notes: list[tuple[str, dict[str, Any]]], operations: list[str] | None = None) -> None:
        super().__init__(ApproverScript(name=name), notes)
        self._rules: list[ApproverRule] = []
        self._lock = threading.Lock()  # rules are set from the test's thread, read on the loop
        self._operations = sorted(operations or [])

    def _add(self, decide: str, operation: str, times: int | None, delay_s: float,
             match: dict[str, Any], reason: str | None = None) -> LiveApprover:
        if not isinstance(operation, str):  # a TypeError from inside fnmatch said nothing of the rule
            raise BadInput(f"approver rule: the operation is a shell pattern string (e.g. 'delete_*'), "
                           f"not {operation!r}")
        ops = self._operations
        if ops and not any(fnmatch.fnmatchcase(op, operation) for op in ops):
            # a typo would match nothing and leave every request to the default denial
            close = difflib.get_close_matches(operation, ops, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise BadInput(f"approver rule: no operation matches {operation!r}{hint}; the catalog has "
                           f"{', '.join(ops)}")
        fields = {"match": {"operation": operation, **match}, "decide": decide, "times": times,
                  "delay_s": delay_s}
        if reason is not None:  # as a script's `reason:`: only a deny carries one
            fields["reason"] = reason
        rule = _valid(ApproverRule, fields, "approver rule")
        with self._lock:
            self._rules.append(rule)
            self.used.append(0)
        return self

    def allow_once(self, operation: str = "*", *, times: int | None = None, delay_s: float = 0.0,
                   **match: Any) -> LiveApprover:
        return self._add("allow_once", operation, times, delay_s, match)

    def allow_session(self, operation: str = "*", *, times: int | None = None, delay_s: float = 0.0,
                      **match: Any) -> LiveApprover:
        return self._add("allow_session", operation, times, delay_s, match)

    def deny(self, operation: str = "*", *, times: int | None = None, delay_s: float = 0.0,
             reason: str | None = None, **match: Any) -> LiveApprover:
        """Deny matching requests; `reason` is the note the agent is told (`vaultsim approve`'s
        `reason:`), as a scenario's deny rule gives it."""
        return self._add("deny", operation, times, delay_s, match, reason)

    def ignore(self, operation: str = "*", *, times: int | None = None, **match: Any) -> LiveApprover:
        """Leave matching requests undecided (the pending and expired paths)."""
        return self._add("ignore", operation, times, 0.0, match)

    def lock(self, operation: str = "*", *, times: int | None = None, **match: Any) -> LiveApprover:
        """Answer a matching request by locking the vault (a person pulling the brake)."""
        return self._add("lock", operation, times, 0.0, match)

    @property
    def rules(self) -> list[ApproverRule]:
        with self._lock:
            return list(self._rules)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every prompt the vault sent this approver, as received (no secrets: what a person sees)."""
        return [dict(p) for m, p in list(self.notes) if m == "approval.requested"]

    def choose(self, req: ApprovalRequested) -> tuple[int | None, ApproverRule | None]:
        with self._lock:
            return self.first_match(self._rules, req)


class LiveWorld:
    """One world for a synchronous caller: set up, agents one after another, graded once."""

    def __init__(self, engine: Engine, root: Path, *, policy: str | Path | dict[str, Any] | None = None,
                 catalog: dict[str, Any] | None = None, fault: str | None = None, locked: bool = False,
                 approver: str | None = "ci", credentials: list[str] | None = None, call_timeout_s: float = 5.0,
                 timeouts: dict[str, float] | None = None, cwd: str | Path | None = None,
                 name: str = "pytest") -> None:
        self.engine = engine
        self.root = Path(root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        if isinstance(policy, dict):
            policy_file = self.root / "policy.yaml"
            policy_file.write_text(yaml.safe_dump(policy))
            policy = policy_file
        doc: dict[str, Any] = {
            "id": _scenario_id(name), "title": name, "credentials": credentials,
            "policy": str(Path(policy).absolute()) if policy is not None else None,
            "catalog": catalog, "approver": {"name": approver, "rules": []} if approver else None,
            "locked": locked,
            "remote": {"fault": fault, "timeouts": timeouts or {}}, "call_timeout_s": call_timeout_s,
            "agents": [{"command": ["true"]}],  # a placeholder: the real agents come with run_agent
            "expect": {"verdict": "PASS"},
        }
        sc = _valid(Scenario, doc, "vaultsim world")
        self.cwd = Path(cwd) if cwd is not None else None
        # a command's relative paths and `{python}` mean what they mean in the test's directory
        self.sc = sc.model_copy(update={"agents": [], "path": self._base() / f"{sc.id}.yaml"})
        self.world = World(self.sc, self.root, engine.launcher, engine.env)
        # no approver: a person's (the demo's TUI) subscribes instead
        self.approver = LiveApprover(approver, self.world.notes, list(sc.catalog_in_use().operations)) \
            if approver else None
        self.trial = Trial(engine.runtime(), Case(self.sc, Expect(verdict="PASS")), 1, self.world)
        self.specs: list[AgentSpec] = []
        self.modes: list[tuple[str, str]] = []  # (isolation, network) of each agent run
        now = time.time()
        self.evidence = Evidence(run_id=self.trial.run_id, started=now, deadline=now)
        self.result: TrialResult | None = None
        self.closed = False
        # before its credentials are written (World.start): another runner's walk passes it over
        self._held = shared_dirs.hold(self.root)
        engine.registry.add_dir(self.root, self.world.keystore.destroy)

    # ---- up ----------------------------------------------------------------------

    def start(self) -> LiveWorld:
        try:
            self.engine.call(self._start())
        except BaseException:
            self.close()
            raise
        return self

    async def _start(self) -> None:
        # World.start, as `vaultsim run`'s trials: it also records the agent socket and the
        # credential files as set up (without them every unjailed agent read as a keyring
        # rewriter, and a removed socket went unseen)
        await self.world.start(self.approver)

    @property
    def run_id(self) -> str:
        return self.trial.run_id

    @property
    def remote_url(self) -> str:
        assert self.world.remote is not None, "the world is not started"
        return self.world.remote.url

    @property
    def home(self) -> Path:
        return self.world.home.root

    @property
    def agent_socket(self) -> Path:
        return self.world.home.agent_sock

    # ---- agents ------------------------------------------------------------------

    def run_agent(self, cmd: str | list[str] | None = None, *, plan: dict[str, Any] | None = None,
                  task: dict[str, Any] | None = None, isolation: str = "none", name: str | None = None,
                  env: dict[str, str] | None = None, network: str = "none") -> AgentRun:
        """Start one agent as a fresh process under the agent contract; wait until it ends or its
        deadline passes (then it is killed, which the grade records)."""
        if self.result is not None or self.closed:
            raise RuntimeError("this world was graded and is stopped (grade() and the plugin's assert_verdict() "
                               "stop it): start agents before grade()")
        if (cmd is None) == (plan is None):
            raise BadInput("run_agent needs a command or an agent_stub plan (one of them)")
        if isolation not in ("none", "auto", "bwrap"):
            raise BadInput(f"isolation {isolation!r}: one of auto, bwrap, none")
        if network not in ("none", "host"):
            raise BadInput(f"network {network!r}: none or host")
        from vault.jail.probe import resolve
        mode, _ = resolve(isolation, network, "vaultsim")  # bwrap where none can be built: BadInput
        task = dict(task or {})
        unknown = sorted(set(task) - {"goal", "operations", "steps", "deadline_s"})
        if unknown:
            raise BadInput(f"task: unknown field {unknown[0]!r} (goal, operations, steps, deadline_s)")
        fields: dict[str, Any] = {"name": name or _name_of(cmd), "operations": task.get("operations"),
                                  "steps": task.get("steps")}
        if cmd is not None:
            fields["command"] = cmd
        else:
            fields["plan"] = plan
        spec = _valid(AgentSpec, {k: v for k, v in fields.items() if v is not None}, "run_agent")
        # relative paths from the directory current now, as documented: a test may have changed
        # it (monkeypatch.chdir to where it wrote its agent) after the world was set up
        self.sc = self.sc.model_copy(update={"path": self._base() / f"{self.sc.id}.yaml"})
        taskspec = _valid(TaskSpec, {k: task[k] for k in ("goal", "deadline_s") if k in task}, "run_agent: task")
        self._check(spec)
        run = self.engine.call(self._run_agent(spec, taskspec, env or {}, mode, network),
                               timeout=taskspec.deadline_s + CALL_TIMEOUT_S)
        return run

    def _base(self) -> Path:
        return self.cwd if self.cwd is not None else Path.cwd()

    def adopt(self, pid: int) -> None:
        """A process the test started to act for it on the agent socket (`vaultsim.client()`'s
        relay) is this world's, as the agents `run_agent` starts are: without this, a child of
        the runner's that is not one of its agents reads as another trial's (vault.lineage) and
        its calls would leave the transcript (vault.runner.foreign_sessions)."""
        start = started(pid)
        if start is not None:  # its calls are the test's, not graded as an agent's (by its identity)
            self.evidence.test_clients[pid] = start
        vouch = self.world.remote.vouch if self.world.remote is not None else None
        if vouch is not None:
            self.engine.call(_adopt(vouch, pid))

    def _check(self, spec: AgentSpec) -> None:
        """The checks `vaultsim run` makes of a scenario's agent before any trial: a program that
        does not exist, an operation the catalog lacks, a bad plan are BadInput, not a trial."""
        probe = self.sc.model_copy(update={"agents": [spec]})
        try:
            check_scenario(probe)
        except BadInput as exc:
            raise BadInput(str(exc).replace(f"{probe.path}: ", "run_agent: ").replace("field agents.0.", "field ")
                           .replace("field agents.0: ", "")) from None

    async def _run_agent(self, spec: AgentSpec, taskspec: TaskSpec, env: dict[str, str], mode: str,
                         network: str) -> AgentRun:
        trial = self.trial
        index = len(self.specs)
        self.specs.append(spec)
        trial.sc = self.sc = self.sc.model_copy(update={"agents": list(self.specs), "task": taskspec})
        self.world.sc = self.sc
        from vault.runner.contract import task_for
        plan = trial._plan(spec)
        trial.plans.append(plan)
        trial.tasks.append(task_for(self.sc, index, spec, plan))
        deadline = time.time() + taskspec.deadline_s
        self.evidence.deadline = max(self.evidence.deadline, deadline)
        saved = trial.rt.env
        trial.rt.env = {**saved, **env}
        trial.rt.isolation, trial.rt.network = mode, network
        self.modes.append((mode, network))
        try:
            run = await trial.run_agent(index, spec, deadline)
        finally:
            trial.rt.env = saved
            # the report's isolation: the jail only when every agent of this world ran in one
            jailed = all(m == "bwrap" for m, _ in self.modes)
            trial.rt.isolation = "bwrap" if jailed else "none"
            trial.rt.network = "host" if any(n == "host" for _, n in self.modes) else "none"
        self.evidence.agents.append(run)
        return run

    # ---- evidence while the world runs ---------------------------------------------

    def ledger(self) -> list[dict[str, Any]]:
        """The remote's ledger (attempts and effects per logical operation), the setup's own
        requests left out."""
        if self.result is not None:
            return list(self.evidence.ledger)
        remote = self.world.remote
        assert remote is not None

        async def snap() -> list[dict[str, Any]]:
            return [e for e in remote.ledger.snapshot()
                    if not all(str(r).startswith(SETUP) for r in e.get("request_ids") or ["-"])]
        return self.engine.call(snap())

    def remote_events(self) -> list[dict[str, Any]]:
        """Every request the remote saw (its event log), the setup's own left out."""
        if self.result is not None:
            return list(self.evidence.remote_events)
        remote = self.world.remote
        assert remote is not None

        async def snap() -> list[dict[str, Any]]:
            return [e for e in remote.events.snapshot() if not str(e.get("correlation_id", "")).startswith(SETUP)]
        return self.engine.call(snap())

    def effects_by_operation(self) -> dict[str, int]:
        if self.result is not None:
            return dict(self.evidence.effects_by_operation())
        ev = Evidence(run_id=self.run_id, started=0, deadline=0, ledger=self.ledger())
        return dict(ev.effects_by_operation())

    def stats(self) -> dict[str, Any]:
        """The daemon's prompt statistics for this world (the graded ones once it is graded)."""
        if self.result is not None:
            return dict(self.evidence.stats)
        return self.engine.call(self.world.stats())

    def transcript(self) -> Transcript:
        """What the vault saw, from its audit log (live, or the graded one)."""
        if self.result is not None:
            return self.evidence.transcript
        ev = Evidence(run_id=self.run_id, started=0, deadline=0, agents=list(self.evidence.agents))
        events = read_audit(self.world, ev)
        if events is None:
            return Transcript()
        pids = {a.pid: a.index for a in ev.agents}
        vouch = self.world.remote.vouch if self.world.remote is not None else None
        strangers = foreign_sessions.find(events, vouch.trial() if vouch is not None else None)
        events = [e for e in events if not strangers.theirs(e)]  # as graded: not the agents'
        return own_clients.unattribute(
            from_audit(events, pids, [(a.started, a.ended) for a in ev.agents], gone_answers.task_ids(ev.agents)),
            self.evidence.test_clients)

    # ---- the end -----------------------------------------------------------------

    def grade(self, expect: dict[str, Any] | Expect | None = None) -> TrialResult:
        """Stop the world and grade it as `vaultsim run` grades a trial. Once per world: a second
        call with the same expectation returns the same result."""
        exp = _expect(expect)
        # the threshold the fatigue figures count with is the expectation's, as a scenario's is
        self.evidence.rubber_stamp_s = exp.prompts.rubber_stamp_s
        if self.result is not None:
            # the same collected evidence, judged against another expectation
            return self.result if exp == self.result.expect else self.trial.judge(self.evidence, exp)
        if self.closed:
            raise RuntimeError("this world is closed")
        self.result = self.engine.call(self.trial.conclude(self.evidence, expect=exp))
        self.result.duration_s = time.time() - self.evidence.started
        return self.result

    def close(self) -> None:
        """Everything down and removed, whatever state it is in; never raises."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            self.engine.call(self.trial.close(), timeout=30)
        self.engine.registry.done_dir(self.root)
        neighbour_state.forget(self.root)
        remove_dir(self.root, self.world.keystore.destroy)
        shutil.rmtree(self.root, ignore_errors=True)
        os.close(self._held)


async def _adopt(vouch: Vouch, pid: int) -> None:
    vouch.add_root(pid)  # on the engine's loop, where the remote reads the roots


def _expect(expect: dict[str, Any] | Expect | None) -> Expect:
    if expect is None:
        return Expect(verdict="PASS")
    if isinstance(expect, Expect):
        return expect
    return _valid(Expect, expect, "expect")


M = TypeVar("M", bound=BaseModel)


def _valid(model: type[M], data: Any, what: str) -> M:
    """A model from a test's arguments; a bad one is BadInput naming the field (as scenario files are)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadInput(f"{what}: {format_validation_error(exc)}") from None


def _name_of(cmd: str | list[str] | None) -> str | None:
    """The agent's session name for a command: its script's or program's name."""
    if cmd is None:
        return None
    from vault.programs import split_command
    words = split_command(cmd, "run_agent") if isinstance(cmd, str) else [str(w) for w in cmd]
    script = next((w for w in words[1:] if w.endswith(".py")), words[0] if words else "agent")
    return Path(script).stem[:40] or "agent"


def _scenario_id(name: str) -> str:
    out = "".join(c if c.isalnum() or c in "_.-" else "-" for c in name.lower()).strip("-._")[:80]
    return out or "pytest"

