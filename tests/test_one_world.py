"""One world: only the runner's world starts a daemon, a remote, an approver or an agent.

vault.runner.world (a trial's world on the runner's loop) and
vault.runner.world_procs (the same parts one at a time, for synchronous
callers: the test fixtures, the demo, the benchmarks, the pytest plugin) are
where those processes start. This test reads the source (the AST, not a
grep) of everything else that could start them (vault/, tui/, bench/ and the
tests' helpers and fixtures) and fails naming each file and line that does:

  A. anywhere: a process start whose command line is a vault part: `python -m
     vault.cli.main daemon|approve|...`, `vault.remote`, `vault.agent_relay`,
     `agent_stub`, a `python -c` script that is an agent (it uses
     AgentClient), or a command line made by world_procs' own builders;
     also a launcher's `.spawn("daemon" | "agent_stub", ...)`;
  B. in the tests' helpers and fixtures, tui/ and bench/: any process start
     at all, except the few files listed with what they start (none of them a
     vault part).

The tests' own test_*.py files may start a process by hand when the start is
what they test (`vaultsim daemon` in the CLI tests), and the agents under
test (tests/agents, tests/mcp_agents) may do what agents do; neither is read.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# the world itself, and the launchers it starts its daemon and agents with
WORLD = {
    "vault/runner/world.py", "vault/runner/world_procs.py",
    "vault/runner/procs.py",  # the launchers' programs: `vaultsim` and `agent_stub` for the world
    "vault/runner/forkserver.py",  # the fork server the world's launcher forks daemons and agents from
}

# rule A, outside the world: a vault part started where the start itself is the product
VAULT_PART_STARTS = {
    "vault/cli/daemon.py": "`vaultsim daemon` detaching its own foreground daemon (the command under test)",
    "bench/suite.py": "times the fork server's own spawn of agent_stub (the launcher is what it measures)",
    "bench/mcp_startup.py": "times `vaultsim mcp` from a host's spawn to `initialize` answered (the spawn is what it measures)",
}

# rule B: fixtures, tui/ and bench/ that start processes that are no vault part
OTHER_STARTS = {
    "tests/fixtures_keyring.py": "a D-Bus session and gnome-keyring",
    "tests/ray_cluster.py": "a Ray cluster",
    "bench/scale.py": "a Ray cluster, and `vaultsim run` (the runner, which builds its worlds itself)",
    "bench/suite.py": "`vaultsim run` (the runner, which builds its worlds itself)",
    "bench/mcp_startup.py": "`vaultsim mcp` as a host spawns it, and a bare interpreter for scale (timed from the spawn)",
    "bench/fixture.py": "pytest, on tests that take the plugin's fixture",
    "bench/instructions.py": "valgrind, counting instructions of an in-process benchmark",
    "bench/gated_instructions.py": "callgrind_control, telling the daemon's callgrind to count or dump",
}

STARTERS = {
    "subprocess.Popen", "subprocess.run", "subprocess.call", "subprocess.check_call", "subprocess.check_output",
    "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell", "asyncio.subprocess.create_subprocess_exec",
    "os.system", "os.popen", "os.posix_spawn", "os.posix_spawnp", "pty.spawn", "multiprocessing.Process",
    *(f"os.{name}" for name in ("execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe",
                                "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle")),
}
VAULT_MODULES = {"vault", "vault.cli.main", "vault.remote", "vault.remote.server", "vault.agent_relay",
                 "vault.cli.daemon", "agent_stub", "vault.approvers.scripted"}
VAULT_SUBCOMMANDS = {"daemon", "approve", "demo", "mcp", "exec", "tui"}
WORLD_BUILDERS = {"vaultsim_argv", "daemon_argv", "agent_stub_argv"}
AGENT_CODE = ("AgentClient", "vault.client")
LAUNCHER_KINDS = {"daemon", "agent_stub"}


@dataclass(frozen=True)
class Start:
    path: str
    line: int
    call: str
    vault_part: str | None  # what vault part it starts, if any

    def __str__(self) -> str:
        what = f" starts {self.vault_part}" if self.vault_part else ""
        return f"{self.path}:{self.line}: {self.call}(...){what}"


class _Scan(ast.NodeVisitor):
    def __init__(self, path: str, tree: ast.Module) -> None:
        self.path = path
        self.aliases: dict[str, str] = {}  # local name -> dotted name it was imported as
        self.strings: dict[str, list[str]] = {}  # module-level name -> the strings it is made of
        self.scopes = []
        self.starts: list[Start] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        self.scopes: list[dict[str, list[str]]] = []  # a function's local names -> their strings
        self.strings = self._assigned(tree.body)

    def _assigned(self, body: list[ast.stmt]) -> dict[str, list[str]]:
        """Names assigned in a module's or function's body (`argv = [...]`, `argv += [...]`), with
        every string each is made of."""
        out: dict[str, list[str]] = {}
        for stmt in body:
            for node in ast.walk(stmt):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not stmt:
                    continue
                targets: list[ast.expr] = []
                if isinstance(node, ast.Assign):
                    targets, value = node.targets, node.value
                elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                    targets, value = [node.target], node.value
                for target in targets:
                    if isinstance(target, ast.Name):
                        out.setdefault(target.id, []).extend(self._strings(value, {target.id}))
        return out

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scopes.append(self._assigned(node.body))
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function

    def _named(self, name: str) -> list[str] | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return self.strings.get(name)

    def dotted(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def _strings(self, node: ast.AST, seen: set[str]) -> list[str]:
        """Every string a call's arguments are made of, module-level constants followed."""
        out: list[str] = []
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                out.append(sub.value)
            elif isinstance(sub, ast.Name) and sub.id not in seen:
                seen.add(sub.id)
                out += self._named(sub.id) or []
            elif isinstance(sub, ast.Call):
                name = self.dotted(sub.func) or ""
                if name.rsplit(".", 1)[-1] in WORLD_BUILDERS:
                    out.append(f"<{name.rsplit('.', 1)[-1]}>")
        return out

    def vault_part(self, strings: list[str]) -> str | None:
        for s in strings:
            if s.startswith("<") and s.endswith(">"):
                return f"a command line from {s[1:-1]}"
            if s in VAULT_MODULES and s != "vault.cli.main":
                return f"`python -m {s}`"
            if any(marker in s for marker in AGENT_CODE) and "\n" in s:
                return "an agent script (it uses the vault's AgentClient)"
        if "vault.cli.main" in strings or "vaultsim" in strings:
            sub = next((s for s in strings if s in VAULT_SUBCOMMANDS), None)
            if sub is not None:
                return f"`vaultsim {sub}`"
        return None

    def visit_Call(self, node: ast.Call) -> None:
        name = self.dotted(node.func) or ""
        args: list[ast.AST] = [*node.args, *(k.value for k in node.keywords)]
        if name in STARTERS:
            strings = [s for a in args for s in self._strings(a, set())]
            self.starts.append(Start(self.path, node.lineno, name, self.vault_part(strings)))
        elif (isinstance(node.func, ast.Attribute) and node.func.attr == "spawn" and node.args
              and isinstance(node.args[0], ast.Constant) and node.args[0].value in LAUNCHER_KINDS):
            self.starts.append(Start(self.path, node.lineno, name or "spawn", f"a launcher's {node.args[0].value!r}"))
        self.generic_visit(node)


def scan_source(path: str, source: str) -> list[Start]:
    tree = ast.parse(source, filename=path)
    scan = _Scan(path, tree)
    scan.visit(tree)
    return scan.starts


def fixture_files() -> list[str]:
    """The tests' helpers and fixtures: every tests/*.py that is no test module of its own."""
    return sorted(f"tests/{p.name}" for p in (ROOT / "tests").glob("*.py") if not p.name.startswith("test_"))


def scanned() -> dict[str, bool]:
    """Every file read, and whether rule B (no process start at all) applies to it."""
    files = {str(p.relative_to(ROOT)): False for p in (ROOT / "vault").rglob("*.py")}
    for folder in ("tui", "bench"):
        files.update({str(p.relative_to(ROOT)): True for p in (ROOT / folder).rglob("*.py")})
    files.update({f: True for f in fixture_files()})
    return {f: strict for f, strict in files.items() if f not in WORLD}


@functools.lru_cache(maxsize=1)
def all_starts() -> dict[str, list[Start]]:
    out: dict[str, list[Start]] = {}
    for path in scanned():
        found = scan_source(path, (ROOT / path).read_text())
        if found:
            out[path] = found
    return out


# ---- the rule ----------------------------------------------------------------------

def test_only_the_world_starts_a_daemon_a_remote_an_approver_or_an_agent() -> None:
    bad = [str(s) for path, starts in all_starts().items() for s in starts
           if s.vault_part is not None and path not in VAULT_PART_STARTS]
    assert bad == [], ("only the runner's world (vault/runner/world.py, vault/runner/world_procs.py) starts "
                       "the vault's parts; start them through it:\n  " + "\n  ".join(bad))


def test_fixtures_the_tui_and_benches_start_no_process_of_their_own() -> None:
    strict = scanned()
    bad = [str(s) for path, starts in all_starts().items() for s in starts
           if strict.get(path) and path not in OTHER_STARTS and path not in VAULT_PART_STARTS]
    assert bad == [], ("the tests' fixtures, the TUI and the benchmarks start processes through the world "
                       "(vault.runner.world_procs):\n  " + "\n  ".join(bad))


def test_every_exception_is_still_needed() -> None:
    """An exception that no longer starts anything goes, so the lists cannot hide a new start."""
    starts = all_starts()
    for path in {*VAULT_PART_STARTS, *OTHER_STARTS}:
        assert (ROOT / path).is_file(), f"{path} is listed as an exception but does not exist"
        assert starts.get(path), f"{path} is listed as an exception but starts no process"
    for path in VAULT_PART_STARTS:
        assert any(s.vault_part for s in starts[path]), f"{path} starts no vault part: list it in OTHER_STARTS"


def test_the_scan_reads_the_fixtures_and_benches_it_is_about() -> None:
    files = scanned()
    for path in ("tests/helpers.py", "tests/hostile_fixtures.py", "tests/tui_fixtures.py", "tests/mcp_world.py",
                 "tests/audit_daemon_helpers.py", "tests/conftest.py", "bench/_procs.py", "bench/tui_latency.py",
                 "tui/demo.py", "vault/pytest_plugin/world.py"):
        assert path in files, path


# ---- the detector finds what it is meant to find ------------------------------------

def test_the_world_modules_themselves_are_what_the_scan_would_flag() -> None:
    """The world's own starts, read with the same scan, are flagged: the scan sees real code."""
    found = {s.vault_part for s in scan_source("world_procs.py", (ROOT / "vault/runner/world_procs.py").read_text())}
    assert "`python -m vault.remote`" in found
    assert "`python -m vault.agent_relay`" in found
    world = scan_source("world.py", (ROOT / "vault/runner/world.py").read_text())
    assert any(s.vault_part == "a launcher's 'daemon'" for s in world), world


BYPASSES = {
    "the remote by hand (the old tests/helpers.py)": '''
import subprocess, sys
PY = sys.executable
def start_remote(root):
    argv = [PY, "-m", "vault.remote", "--port", "0"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE)
''',
    "a daemon by hand (the old bench/tui_latency.py)": '''
import subprocess, sys
def start_daemon(env):
    return subprocess.Popen([sys.executable, "-m", "vault.cli.main", "daemon", "--foreground", "--unlocked"], env=env)
''',
    "an approver through an alias": '''
from subprocess import Popen as P
from helpers import PY
P([PY, "-m", "vault.cli.main", "approve", "--script", "s.yaml"])
''',
    "an agent script on an event loop (the old tests/tui_fixtures.py)": '''
import asyncio
PRELUDE = "import os\\nfrom vault.client import AgentClient\\nc = AgentClient(os.environ['VAULTSIM_SOCKET'])\\n"
async def agent(body):
    return await asyncio.create_subprocess_exec("python3", "-c", PRELUDE + body)
''',
    "agent_stub run to its end (the old Sandbox.run_agent)": '''
import subprocess
def run(plan):
    return subprocess.run(["python3", "-m", "agent_stub", "--plan", plan], capture_output=True)
''',
    "the world's command line, started around the world": '''
import subprocess
from vault.runner.world_procs import daemon_argv
subprocess.Popen(daemon_argv("--remote", "http://x"))
''',
    "a launcher's daemon": '''
async def up(launcher):
    return await launcher.spawn("daemon", ["daemon", "--foreground"], env={}, cwd=".", stdout=None, stderr=None)
''',
}


@pytest.mark.parametrize("name", sorted(BYPASSES))
def test_a_start_around_the_world_is_caught(name: str) -> None:
    starts = scan_source("bypass.py", BYPASSES[name])
    assert [s for s in starts if s.vault_part], f"{name}: not caught ({starts})"


def test_what_is_no_vault_part_is_a_start_but_not_a_vault_part() -> None:
    starts = scan_source("other.py", '''
import subprocess, sys
subprocess.Popen(["dbus-daemon", "--session", "--print-address"])
subprocess.run([sys.executable, "-m", "vault.cli.main", "run", "scenarios/"])
print("vault.remote")
''')
    assert [(s.line, s.vault_part) for s in starts] == [(3, None), (4, None)]
