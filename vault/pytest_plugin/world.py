"""`Vaultsim`: the object the `vaultsim` fixture gives a test, and the factory that makes them.

A test sets the approver's rules, runs agents (fresh processes under the agent
contract) or calls the agent socket through `client()`, then reads evidence
and asserts. Two kinds of evidence, and when each is read:

    live, any time       effects / ledger (the remote's), prompts (the daemon's
                         stats), transcript and results (the audit log)
    graded, once         grade(), assert_verdict(), assert_no_leaked_approval():
                         the world is stopped (its audit log closed with a signed
                         head) and graded by the runner, as a `vaultsim run` trial
                         ends; later evidence reads come from that collection

Every failure message names the verdict (the check of `vaultsim run` that the
assertion stands for) and the evidence behind it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from vault.client import AgentClient
from vault.runner.evidence import AgentRun
from vault.runner.live import Engine, LiveApprover, LiveWorld
from vault.runner.scenario import Expect
from vault.runner.transcript import Entry, Transcript
from vault.runner.trial import TrialResult
from vault.runner.world_procs import start_agent_relay
from vault.pytest_plugin.evidence import AgentResult, Prompts, report, trace
from vault.pytest_plugin.summary import mark, running

# AF_UNIX paths hold about 108 bytes: a home deeper than this moves to a short /tmp directory
MAX_ROOT = 80
RELAY_START_S = 10.0


class VaultsimFailure(AssertionError):
    """An assertion helper failed; the message reads like `vaultsim run`'s report."""


class Vaultsim:
    """One world for one test: home, keyring, fake remote, daemon, scripted approver."""

    def __init__(self, live: LiveWorld, name: str, item: pytest.Item | None = None) -> None:
        self.live = live
        self.name = name
        self.item = item  # the test this world's grade is recorded on (vault.pytest_plugin.summary)
        self._marked = False
        self._clients: list[tuple[AgentClient, subprocess.Popen[bytes]]] = []

    # ---- the world ----------------------------------------------------------------

    @property
    def approver(self) -> LiveApprover:
        """The scripted approver: `.deny(op)`, `.allow_once(op)`, `.allow_session(op)`,
        `.ignore(op)`, `.lock(op)`; first matching rule wins; anything unmatched is denied."""
        assert self.live.approver is not None
        return self.live.approver

    @property
    def home(self) -> Path:
        return self.live.home

    @property
    def agent_socket(self) -> Path:
        return self.live.agent_socket

    @property
    def run_id(self) -> str:
        return self.live.run_id

    def run_agent(self, cmd: str | list[str] | None = None, *, task: dict[str, Any] | None = None,
                  plan: dict[str, Any] | None = None, isolation: str = "auto", name: str | None = None,
                  env: dict[str, str] | None = None, network: str = "none") -> AgentResult:
        """Run the agent under test as a fresh process (VAULTSIM_SOCKET, VAULTSIM_TASK,
        VAULTSIM_RUN_ID, as `vaultsim run` does) until it exits or its task deadline passes.

        cmd: shell words or a list (`{python}` is this interpreter; relative paths from the
        current directory); or plan: an agent_stub plan. task: goal, operations, steps,
        deadline_s (default 20). isolation: as `vaultsim run --isolation` (auto: the jail where
        bubblewrap works, else none with a warning; bwrap: the jail or BadInput); network: a
        jailed agent's network, none or host."""
        run = self.live.run_agent(cmd, plan=plan, task=task, isolation=isolation, name=name, env=env,
                                  network=network)
        return AgentResult(run, self._entries_of(run), self.live.trial.redact)

    def client(self, agent: str = "pytest-client", *, timeout: float = 30.0) -> AgentClient:
        """An agent client on the agent socket, its session open. The calls go through a fresh
        relay process (vault.agent_relay): the vault sees that process as the agent, so the
        test's own process stays able to approve (an agent never approves its own requests)."""
        if self.live.result is not None or self.live.closed:
            # said as run_agent says it: the relay's session.open would meet a stopped daemon and
            # fail as "the daemon closed the connection", which reads as a fault of the vault
            raise RuntimeError("this world was graded and is stopped (grade() and assert_verdict() stop "
                               "it): open clients before grade()")
        root = self.live.root
        listen = root / f"relay-{len(self._clients)}.sock"
        proc = start_agent_relay(listen, self.agent_socket, env=self.live.engine.env, cwd=root)
        self.live.engine.registry.add_group(proc.pid)
        self.live.adopt(proc.pid)  # the world's own client, not another run's process
        client = AgentClient(listen, timeout=timeout)
        self._clients.append((client, proc))
        client.open_session(agent, self.run_id)
        return client

    # ---- evidence -----------------------------------------------------------------

    @property
    def transcript(self) -> Transcript:
        """What the vault saw, from its audit log."""
        return self.live.transcript()

    @property
    def results(self) -> list[Entry]:
        """Every result the vault gave any agent, in order (calls, resumes, lookups)."""
        return list(self.transcript.entries)

    @property
    def ledger(self) -> list[dict[str, Any]]:
        """The fake remote's ledger: attempts and effects per logical operation."""
        return self.live.ledger()

    @property
    def remote_events(self) -> list[dict[str, Any]]:
        """Every request that reached the fake remote, in order (no credential: the remote's log)."""
        return self.live.remote_events()

    def effects(self, operation: str | None = None) -> Any:
        """What really took effect on the remote: the count for one operation, or all of them."""
        counts = self.live.effects_by_operation()
        return counts.get(operation, 0) if operation is not None else counts

    @property
    def prompts(self) -> Prompts:
        return Prompts.of(self.live.stats())

    @property
    def agents(self) -> list[AgentResult]:
        runs: list[AgentRun] = list(self.live.evidence.agents)
        entries = self.results
        return [AgentResult(r, [e for e in entries if e.agent_index == r.index], self.live.trial.redact)
                for r in runs]

    def grade(self, expect: dict[str, Any] | Expect | None = None) -> TrialResult:
        """Stop the world and grade it as `vaultsim run` does (expect: a scenario `expect`
        mapping; default {"verdict": "PASS"}). Agents must have run before."""
        self._close_clients()
        result = self.live.grade(expect)
        # a world of a module- or session-scoped fixture has no test of its own: the one grading it
        item = self.item if self.item is not None else (running[-1] if running else None)
        if item is not None and not self._marked:  # one world is one graded trial
            self._marked = True
            mark(item, result.verdict, result.false_pass)
        return result

    # ---- assertions ---------------------------------------------------------------

    def assert_verdict(self, verdict: str = "PASS", **expect: Any) -> TrialResult:
        """The world's verdict is `verdict` and no other check failed beyond `also`."""
        __tracebackhide__ = True
        result = self.grade({"verdict": verdict, **expect})
        if not result.ok:
            from vault.pytest_plugin.setup_notes import notes
            raise VaultsimFailure(report(result, self.name, notes(self.live.approver, result)))
        return result

    def assert_no_leaked_approval(self) -> None:
        """No gated call ran without its own decision or a grant of its own session and process."""
        __tracebackhide__ = True
        self._assert_check("FAIL_LEAKED_APPROVAL")

    def assert_no_secret_leak(self) -> None:
        """No credential or approver token appears anywhere an agent or a log could see."""
        __tracebackhide__ = True
        self._assert_check("FAIL_SECRET_LEAK")

    def _assert_check(self, check: str) -> None:
        __tracebackhide__ = True
        result = self.live.result or self.grade()
        if check in result.failed:
            why = [f"{check}: {x}" for x in (result.grade.findings.get(check) if result.grade else []) or []]
            raise VaultsimFailure(report(result, self.name, extra=why).replace(
                "vaultsim: ", f"vaultsim: {check} — ", 1))

    def assert_prompts(self, max: int | None = None, *, count: int | None = None,
                       scopes: dict[str, int] | None = None) -> Prompts:
        """At most `max` prompts (or exactly `count`); at most N prompts per scope given."""
        __tracebackhide__ = True
        p = self.prompts
        problems = []
        if max is not None and p.count > max:
            problems.append(f"{p.count} prompts, at most {max} allowed")
        if count is not None and p.count != count:
            problems.append(f"{p.count} prompts, expected {count}")
        for scope, most in (scopes or {}).items():
            if p.by_scope.get(scope, 0) > most:
                problems.append(f"{p.by_scope[scope]} prompts for scope {scope}, at most {most} allowed")
        if problems:
            raise VaultsimFailure(f"vaultsim: FAIL_APPROVAL_FATIGUE — {'; '.join(problems)}\n"
                                  f"  evidence: {p.describe()}\n"
                                  f"    by operation: {p.by_operation}\n    decisions: {p.decisions}\n"
                                  f"    transcript: {trace(self.results, p.count)}")
        return p

    def assert_effects(self, **expected: int) -> dict[str, int]:
        """Each named operation took effect on the remote exactly this many times."""
        __tracebackhide__ = True
        counts = self.effects()
        wrong = {op: (counts.get(op, 0), n) for op, n in expected.items() if counts.get(op, 0) != n}
        if wrong:
            verdict = "FAIL_DUPLICATE_EFFECT" if any(got > want for got, want in wrong.values()) else "FAIL_OUTCOME"
            said = "; ".join(f"{op} took effect {got} time{'s' if got != 1 else ''}, expected {want}"
                             for op, (got, want) in wrong.items())
            raise VaultsimFailure(f"vaultsim: {verdict} — {said}\n"
                                  f"  evidence: effects {dict(counts)}; attempts "
                                  f"{ {e['route']: e.get('attempts', 0) for e in self.ledger} }\n"
                                  f"    transcript: {trace(self.results, self.prompts.count)}")
        return dict(counts)

    def describe(self) -> str:
        """The world's evidence in a few lines, for a failing test's report; never raises."""
        from vault.runner.world import tail
        lines = [f"home {self.home}, run id {self.run_id}"]
        for label, read in (("effects", lambda: self.effects()), ("prompts", lambda: self.prompts.describe()),
                            ("transcript", lambda: trace(self.results, self.prompts.count))):
            try:
                lines.append(f"{label}: {read()}")
            except Exception as exc:  # a world that broke mid-test still gets the rest reported
                lines.append(f"{label}: unavailable ({type(exc).__name__})")
        for run in self.live.evidence.agents:
            lines.append(f"agent {run.name}: exit {run.exit_code}, final {run.final[:200]!r}")
        lines.append("daemon log (last lines):")
        lines += ["  " + x for x in tail(self.live.world.daemon_log, 8).splitlines()]
        return self.live.trial.redact("\n".join(lines))  # an agent's final message may hold a leaked value

    # ---- teardown -----------------------------------------------------------------

    def _entries_of(self, run: AgentRun) -> list[Entry]:
        return [e for e in self.results if e.agent_index == run.index]

    def _close_clients(self) -> None:
        clients, self._clients = self._clients, []
        for client, proc in clients:
            try:
                client.close()
            except OSError:
                pass
            proc.kill()
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            self.live.engine.registry.done_group(proc.pid)

    def close(self) -> None:
        """Everything down and removed (clients, agents, daemon, remote, home, keyring entry)."""
        try:
            self._close_clients()
        finally:
            self.live.close()


def _jail_private(path: Path) -> bool:
    """Whether every agent jail hides this directory (it is under a private /tmp or /var/tmp)."""
    from vault.jail.spec import PRIVATE
    real = os.path.realpath(path)
    return any(real.startswith(p.rstrip("/") + "/") for p in PRIVATE)


class VaultsimFactory:
    """Makes started worlds on a shared engine; closes every one it made."""

    def __init__(self, engine: Engine, parent: Path | None, name: str, item: pytest.Item | None = None) -> None:
        self.engine, self.parent, self.name, self.item = engine, parent, name, item
        self.made: list[Vaultsim] = []

    def __call__(self, *, policy: str | Path | dict[str, Any] | None = None, catalog: dict[str, Any] | None = None,
                 fault: str | None = None, locked: bool = False, approver: str = "ci",
                 credentials: list[str] | None = None, call_timeout_s: float = 5.0,
                 timeouts: dict[str, float] | None = None) -> Vaultsim:
        root = self._root()
        try:
            live = LiveWorld(self.engine, root, policy=policy, catalog=catalog, fault=fault, locked=locked,
                             approver=approver, credentials=credentials, call_timeout_s=call_timeout_s,
                             timeouts=timeouts, name=self.name)
        except BaseException:  # bad options: nothing started, and the directory made for it goes
            shutil.rmtree(root, ignore_errors=True)
            raise
        world = Vaultsim(live, self.name, self.item)
        self.made.append(world)
        live.start()
        return world

    def _root(self) -> Path:
        n = len(self.made)
        if self.parent is not None and len(str(self.parent)) + 8 <= MAX_ROOT and _jail_private(self.parent):
            return self.parent / f"vs{n}"
        # outside /tmp (TMPDIR or --basetemp elsewhere) a jail shows the host's files read-only:
        # another world's home and keyring there (a factory's second world, an xdist neighbour's)
        # would be readable by this world's jailed agent. Under /tmp, as `vaultsim run` keeps its
        # trials, every jail has a private /tmp instead
        return Path(tempfile.mkdtemp(prefix=f"vsp-{os.getpid()}-", dir="/tmp"))

    def close(self) -> None:
        made, self.made = self.made, []
        try:
            if self.item is None:  # a module's or session's factory: its fixture is ending
                from vault.pytest_plugin.ungraded import grade_shared
                grade_shared(made)
        finally:
            for world in reversed(made):
                world.close()
