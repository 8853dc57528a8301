"""The agent jail: what a jailed program can and cannot reach, `vaultsim exec`, isolation options.

Real bubblewrap, a real daemon and fake remote, real processes; a probe program
tries every door an unsafe agent would and reports which opened.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import PY, ROOT, Sandbox, canary
from vault.jail import JailSpec
from vault.jail.probe import problem

needs_bwrap = pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")

# tries each door from inside; prints one JSON object
PROBE = textwrap.dedent("""
    import json, os, socket, sys
    home, keyring, daemon_pid, port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    out = {}
    def attempt(name, fn):
        try:
            fn(); out[name] = "open"
        except OSError as exc:
            out[name] = exc.__class__.__name__
    attempt("approver.token", lambda: open(os.path.join(home, "approver.token")).read())
    attempt("credentials.enc", lambda: open(os.path.join(home, "credentials.enc"), "rb").read())
    attempt("keyring", lambda: open(keyring, "rb").read())
    def approver_sock():
        s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(os.path.join(home, "approver.sock"))
    attempt("approver.sock", approver_sock)
    def remote():
        s = socket.create_connection(("127.0.0.1", port), timeout=2); s.close()
    attempt("remote port", remote)
    attempt("daemon mem", lambda: open(f"/proc/{daemon_pid}/mem", "rb").read(1))
    out["home listing"] = sorted(os.listdir(home))
    out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
    out["caps"] = sorted({status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")})
    out["no_new_privs"] = status["NoNewPrivs"].strip()
    s = socket.socket(socket.AF_UNIX); s.connect(os.environ["VAULTSIM_SOCKET"]); f = s.makefile("rwb")
    def rpc(i, method, **params):
        f.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode() + b"\\n")
        f.flush(); return json.loads(f.readline())["result"]
    sid = rpc(1, "session.open", agent="prober")["session_id"]
    out["call"] = rpc(2, "call", session_id=sid, operation="read_issue", params={"issue_id": "ISS-1"})["category"]
    out["env"] = sorted(k for k in os.environ if k.startswith(("VAULTSIM", "PYTHON_KEYRING", "DBUS")))
    print(json.dumps(out))
""")


@pytest.fixture
def vault(sandbox: Sandbox) -> dict[str, Any]:
    """A daemon serving a real remote, with one credential the remote accepts."""
    secret = canary()
    remote, url = sandbox.start_remote({"tracker_token": secret})
    sandbox.set_secret("tracker_token", secret)
    daemon = sandbox.start_daemon("--remote", url)
    return {"sandbox": sandbox, "url": url, "port": int(url.rsplit(":", 1)[1]), "daemon": daemon,
            "secret": secret}


def exec_probe(vault: dict[str, Any], *options: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    box: Sandbox = vault["sandbox"]
    proc = box.vaultsim("exec", *options, "--", PY, "-c", PROBE, str(box.home),
                        str(box.root / "kr" / "keyring.json"), str(vault["daemon"].pid), str(vault["port"]))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc, json.loads(lines[-1]) if lines else {}


@needs_bwrap
class TestInsideTheJail:
    def test_the_agent_socket_works_and_nothing_else_is_there(self, vault: dict[str, Any]) -> None:
        """Under `vaultsim exec`, a program calls through the vault but cannot open the vault home,
        the keyring, approver.sock, the remote's port or the daemon's memory."""
        proc, seen = exec_probe(vault)
        assert 0 == proc.returncode, proc.stderr
        assert "success" == seen["call"]
        assert {"approver.token": "FileNotFoundError", "credentials.enc": "FileNotFoundError",
                "keyring": "FileNotFoundError", "approver.sock": "FileNotFoundError",
                "daemon mem": "FileNotFoundError"} == {k: seen[k] for k in
                                                       ("approver.token", "credentials.enc", "keyring",
                                                        "approver.sock", "daemon mem")}
        assert seen["remote port"] in ("ConnectionRefusedError", "OSError")
        assert ["agent.sock"] == seen["home listing"]
        assert vault["daemon"].pid not in seen["pids"] and max(seen["pids"]) < 100  # its own PID namespace
        assert ["0000000000000000"] == seen["caps"] and "1" == seen["no_new_privs"]
        assert ["VAULTSIM_SOCKET"] == seen["env"]
        assert vault["secret"] not in proc.stdout + proc.stderr

    def test_host_network_is_the_hosts(self, vault: dict[str, Any]) -> None:
        """--network host shares the host's network (an agent that needs a model API): the remote's
        port answers, the files stay hidden."""
        proc, seen = exec_probe(vault, "--network", "host")
        assert 0 == proc.returncode, proc.stderr
        assert "open" == seen["remote port"]
        assert "FileNotFoundError" == seen["approver.token"]

    def test_without_the_jail_every_door_is_open(self, vault: dict[str, Any]) -> None:
        """The same probe with --isolation none (what the jail is for): the files open."""
        proc, seen = exec_probe(vault, "--isolation", "none")
        assert 0 == proc.returncode, proc.stderr
        assert "open" == seen["approver.token"] == seen["keyring"] == seen["remote port"]

    def test_exit_status_and_nothing_left_running(self, vault: dict[str, Any]) -> None:
        """The program's exit status is exec's; what it left running ends with its jail."""
        box: Sandbox = vault["sandbox"]
        tag = str(900000 + os.getpid() % 99999)
        proc = box.vaultsim("exec", "--", "/bin/sh", "-c", f"(setsid sleep {tag} &) ; exit 7")
        assert 7 == proc.returncode, proc.stderr
        left = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", tag]]
        assert [] == left

    def test_a_signal_death_stays_one(self, vault: dict[str, Any]) -> None:
        """A program killed by a signal: `vaultsim exec` ends by the same signal."""
        box: Sandbox = vault["sandbox"]
        proc = box.vaultsim("exec", "--", "/bin/sh", "-c", "kill -KILL $$")
        assert -9 == proc.returncode, proc.stderr

    def test_bad_input(self, vault: dict[str, Any], tmp_path: Path) -> None:
        """No program: exit 2; no daemon for the home: exit 1; both say why."""
        box: Sandbox = vault["sandbox"]
        missing = box.vaultsim("exec", "--", "no-such-program-x")
        assert 2 == missing.returncode and "no program" in missing.stderr
        nobody = box.vaultsim("exec", "--home", str(tmp_path), "--", "true")
        assert 1 == nobody.returncode and "no vault daemon" in nobody.stderr

    def test_mcp_bridge_runs_inside(self, vault: dict[str, Any]) -> None:
        """`vaultsim exec -- vaultsim mcp`: the MCP bridge answers tools/list from inside a jail."""
        box: Sandbox = vault["sandbox"]
        requests = [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
        ]
        proc = subprocess.Popen([PY, "-m", "vault.cli.main", "exec", "--", PY, "-m", "vault.cli.main", "mcp"],
                                env=box.env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        answers: dict[int, Any] = {}

        def send(req: dict[str, Any]) -> None:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(req) + "\n")
            proc.stdin.flush()

        def answer(rid: int) -> None:  # as a host does: the next request after the answer
            assert proc.stdout is not None
            while rid not in answers:
                line = proc.stdout.readline()
                if not line:
                    return
                msg = json.loads(line)
                answers[msg.get("id")] = msg

        send(requests[0])
        answer(1)
        send(requests[1])
        send(requests[2])
        answer(2)
        proc.stdin.close()
        proc.wait(timeout=30)
        assert 2 in answers, proc.stderr.read() if proc.stderr else ""
        assert "result" in answers[2], answers[2]
        assert "create_issue" in {t["name"] for t in answers[2]["result"]["tools"]}


@needs_bwrap
class TestJoiner:
    def test_cold_joiner_runs_a_command_in_the_jail(self) -> None:
        """`python -m vault.jail SPEC -- CMD` (the launcher without a fork server): the command runs
        with no capability, in its own PID namespace, a hidden directory empty, its status returned."""
        secret_dir = Path(tempfile.mkdtemp(prefix="vs-hidden-", dir=Path.home()))  # outside /tmp
        try:
            (secret_dir / "x").write_text("hidden")
            spec = JailSpec(hide=(str(secret_dir),), cwd="/")
            code = ("import os,sys; s=open('/proc/self/status').read();"
                    f"sys.exit(0 if 'CapEff:\\t0000000000000000' in s and not os.listdir({str(secret_dir)!r}) "
                    "and os.getpid() < 100 else 9)")
            proc = subprocess.run([PY, "-m", "vault.jail", json.dumps(spec.to_dict()), "--", PY, "-c", code],
                                  capture_output=True, text=True, timeout=60)
        finally:
            shutil.rmtree(secret_dir)
        assert 0 == proc.returncode, proc.stderr
        assert "" == proc.stderr

    def test_tripwire_ports_record_a_knock_without_its_bytes(self, tmp_path: Path) -> None:
        """A connection to a tripwire port inside the jail is written down (method, control API,
        an Authorization header), never the bytes the agent sent."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        log = tmp_path / "knocks"
        spec = JailSpec(cwd="/", ports=(port,), port_log=str(log))
        knock = ("import socket; s=socket.create_connection(('127.0.0.1', %d), timeout=5);"
                 "s.sendall(b'POST /_sim/fault HTTP/1.1\\r\\nAuthorization: Bearer TOPSECRET\\r\\n\\r\\n');"
                 "s.recv(100)" % port)
        proc = subprocess.run([PY, "-m", "vault.jail", json.dumps(spec.to_dict()), "--", PY, "-c", knock],
                              capture_output=True, text=True, timeout=60)
        assert 0 == proc.returncode, proc.stderr
        # the report also names the agent's process (its keeper's "agent" line): the knock is the port's
        (entry,) = [d for d in map(json.loads, log.read_text().splitlines()) if "port" in d]
        assert (port, "POST", True, True) == (entry["port"], entry["method"], entry["control_api"],
                                              entry["authorization"])
        assert "TOPSECRET" not in log.read_text()


class TestWhatAJailShows:
    def test_a_command_agent_in_a_temp_dir_sees_its_own_files_only(self, tmp_path: Path) -> None:
        """A command agent's script in a temp dir is shown read-only with its directory; never /tmp
        itself, nor a directory holding the trial."""
        from vault.runner.tripwires import AgentJail
        trial = Path(tempfile.mkdtemp(prefix="vsr-test-", dir="/tmp"))
        try:
            (tmp_path / "agent.py").write_text("pass")
            # cwd "/" and no interpreter word: what is shown must not depend on where this checkout is
            jail = AgentJail(trial, 0, trial / "h", [], trial / "st" / "a", "/",
                             command=[str(tmp_path / "agent.py"), "/tmp", str(trial / "h"), "/tmp/x.py"])
            assert [str(tmp_path)] == jail._program_paths()
            loose = Path("/tmp") / f"vs-loose-{os.getpid()}.py"
            loose.write_text("pass")
            try:
                jail.command = [str(loose)]
                assert [str(loose)] == jail._program_paths()  # the file alone, not /tmp
            finally:
                loose.unlink()
        finally:
            shutil.rmtree(trial)


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "vault.cli.main", "run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


class TestRunIsolation:
    def test_bwrap_required_but_missing_is_bad_input(self, tmp_path: Path) -> None:
        """--isolation bwrap where bubblewrap cannot run: exit 2, before any trial, saying why."""
        env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
        proc = run("scenarios/gate-1-healthy-delivery.yaml", "--isolation", "bwrap", env=env)
        assert 2 == proc.returncode
        assert "bubblewrap" in proc.stderr and "[1/1]" not in proc.stdout

    def test_auto_falls_back_with_one_warning_in_the_report(self, tmp_path: Path) -> None:
        """--isolation auto without bubblewrap: one warning, trials run unjailed, the report says so."""
        env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
        proc = run("scenarios/gate-1-healthy-delivery.yaml", "scenarios/locked-vault.yaml",
                   "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml"), env=env)
        assert 0 == proc.returncode, proc.stdout + proc.stderr
        assert 1 == proc.stderr.count("warning: agents run without a jail")
        doc = json.loads((tmp_path / "r.json").read_text())
        assert ("none", "host") == (doc["run"]["isolation"], doc["run"]["agent_network"])
        assert "bubblewrap" in doc["run"]["isolation_note"]
        assert {("none", "host")} == {(t["isolation"], t["network"]) for s in doc["scenarios"]
                                      for t in s["trial_results"]}
        assert "isolation: none; agents run without a jail (bubblewrap" in proc.stdout

    @needs_bwrap
    def test_every_trial_records_its_isolation(self, tmp_path: Path) -> None:
        """JSON and JUnit name the isolation and network of every trial."""
        proc = run("scenarios/gate-1-healthy-delivery.yaml", "--isolation", "bwrap",
                   "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml"))
        assert 0 == proc.returncode, proc.stdout + proc.stderr
        doc = json.loads((tmp_path / "r.json").read_text())
        trial = doc["scenarios"][0]["trial_results"][0]
        assert ("bwrap", "none") == (trial["isolation"], trial["network"])
        assert ("bwrap", "none", None) == (doc["run"]["isolation"], doc["run"]["agent_network"],
                                           doc["run"]["isolation_note"])
        suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
        assert suite is not None
        props = {p.get("name"): p.get("value") for p in suite.iter("property")}
        assert ("bwrap", "none") == (props["trial.1.isolation"], props["trial.1.network"])
        assert "isolation: bwrap (each agent in its own jail; network none)" in proc.stdout


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK) or shutil.which("setpriv") is None,
                    reason="needs root, setpriv and a system python3 to act as an unprivileged user")
def test_an_unprivileged_user_gets_the_same_jail() -> None:
    """As an ordinary user (nobody) bwrap makes a user namespace too: joining it outermost first
    gives the same jail, no capability and a PID namespace of its own."""
    spec = JailSpec(cwd="/")
    code = ("import os,sys; s=open('/proc/self/status').read();"
            "sys.exit(0 if os.getuid() == 65534 and 'CapEff:\\t0000000000000000' in s and os.getpid() < 100 else 9)")
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                           "env", f"PYTHONPATH={ROOT}", "/usr/bin/python3", "-m", "vault.jail",
                           json.dumps(spec.to_dict()), "--", "/usr/bin/python3", "-c", code],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert 0 == proc.returncode, proc.stderr


@needs_bwrap
def test_an_agent_run_by_a_venv_in_tmp_gets_its_whole_environment(tmp_path: Path) -> None:
    """A venv under /tmp (the jail's private scratch): its bin/python links out of it, yet the
    interpreter needs pyvenv.cfg and site-packages where it was started, so the venv is shown."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    pkg = next((venv / "lib").glob("python*/site-packages"))
    (pkg / "agent_dep.py").write_text("WORD = 'found in the venv'\n")
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "main.py").write_text("import agent_dep; print(agent_dep.WORD)\n")
    out = run_jailed_agent(tmp_path, agent, [str(venv / "bin" / "python"), "main.py"])
    assert "found in the venv" in out


def run_jailed_agent(tmp_path: Path, cwd: Path, command: list[str]) -> str:
    """One command in a trial's agent jail (vault.runner.tripwires.AgentJail), cold joiner."""
    import asyncio

    from vault.runner.tripwires import AgentJail

    root = tmp_path / "trial"
    home = root / "h"
    state = root / "st"
    for d in (home, state):
        d.mkdir(parents=True)
    (home / "agent.sock").touch()

    async def go() -> str:
        jail = AgentJail(root, 0, home, [], state, str(cwd), "none", (), command=command)
        spec = await jail.start()
        try:
            proc = await asyncio.create_subprocess_exec(
                PY, "-m", "vault.jail", json.dumps(spec.to_dict()), "--", *command,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=str(cwd))
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
            return out.decode(errors="replace")
        finally:
            await jail.close()
    return asyncio.run(go())
