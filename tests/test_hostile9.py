"""Ninth hostile pass: bombs in the files a user hands the CLIs, and the daemon beside hostile peers.

Real processes and real files only: `vaultsim` run as a user runs it (with an
address-space cap, so a bomb that would take the machine fails the test instead),
and real sockets against a real daemon.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from helpers import PY, ROOT, wait_for

if TYPE_CHECKING:
    from audit_fixtures import LogFiles
    from helpers import Sandbox

SCENARIOS = ROOT / "scenarios"
MEMORY_CAP = 2 << 30  # bytes of address space for one CLI run: a bomb's expansion is far past it


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def vaultsim(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VAULTSIM_HOME": str(cwd / "home")}
    return subprocess.run([PY, "-m", "vault.cli.main", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=env, preexec_fn=_capped)


def laughs(indent: int) -> str:
    """Nine anchors, each ten aliases of the one before: 10**9 strings once written out as a tree."""
    rows = ['x0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    return "\n".join(" " * indent + row for row in rows)


APPROVER = f"approver: {{file: {SCENARIOS / 'approvers' / 'allow-session.yaml'}}}"
PLAN = SCENARIOS / "plans" / "delete-release.yaml"

# Places where a scenario takes free-form values (validated as "any mapping"), so the bomb
# passes pydantic and used to reach the runner, which wrote the agent's task file as JSON.
BOMBS = {
    "inline plan params": f"""title: bomb
{APPROVER}
agents:
  - plan:
      agent: releaser
      steps:
        - call: delete_release
          params:
{laughs(12)}
expect: {{verdict: PASS}}
""",
    "task steps params": f"""title: bomb
{APPROVER}
agents:
  - plan: {PLAN}
    steps:
      - call: delete_release
        params:
{laughs(10)}
expect: {{verdict: PASS}}
""",
    "expected state's where": f"""title: bomb
{APPROVER}
agents:
  - plan: {PLAN}
expect:
  verdict: PASS
  outcome:
    state:
      - collection: releases
        count: 1
        where:
{laughs(10)}
""",
}


class TestAliasBombsInScenarioFiles:
    @pytest.mark.parametrize("where", sorted(BOMBS))
    def test_an_alias_bomb_is_refused_naming_the_file_before_anything_starts(self, tmp_path: Path,
                                                                             where: str) -> None:
        """A nine-line billion-laughs in a free-form field of a scenario passed validation (the
        loader keeps aliases shared) and then ran the runner out of memory writing the agent's task:
        exit 3 after half a minute, or the machine's memory. Now exit 2 at load, naming the file."""
        scenario = tmp_path / "bomb.yaml"
        scenario.write_text(BOMBS[where])
        out = vaultsim(tmp_path, "run", str(scenario))
        assert 2 == out.returncode, out.stdout[-2000:] + out.stderr[-2000:]
        assert f"{scenario}: not read: its aliases expand past" in out.stderr
        assert "Traceback" not in out.stderr

    def test_a_bomb_in_a_plan_file_the_scenario_names_is_refused_naming_the_plan(self, tmp_path: Path) -> None:
        plan = tmp_path / "plan.yaml"
        plan.write_text(f"agent: releaser\nsteps:\n  - call: delete_release\n    params:\n{laughs(6)}\n")
        scenario = tmp_path / "uses-plan.yaml"
        scenario.write_text(f"title: plan bomb\n{APPROVER}\nagents: [{{plan: plan.yaml}}]\nexpect: {{verdict: PASS}}\n")
        out = vaultsim(tmp_path, "run", str(scenario))
        assert 2 == out.returncode, out.stdout[-2000:] + out.stderr[-2000:]
        assert f"{plan}: not read: its aliases expand past" in out.stderr

    def test_a_value_that_holds_itself_is_refused_not_a_harness_error(self, tmp_path: Path) -> None:
        """`&a {x: *a}` loads as a mapping inside itself: the runner failed the trial as a harness
        error (exit 3, no decision). It is the file's fault: exit 2 naming it."""
        scenario = tmp_path / "cycle.yaml"
        scenario.write_text(f"title: cycle\n{APPROVER}\nagents:\n  - plan:\n      agent: r\n"
                            "      steps: [{call: read_issue, params: &a {x: *a}}]\nexpect: {verdict: PASS}\n")
        out = vaultsim(tmp_path, "run", str(scenario))
        assert 2 == out.returncode, out.stdout[-2000:] + out.stderr[-2000:]
        assert f"{scenario}: not read: a value refers to itself" in out.stderr


class TestHostileJsonReports:
    @pytest.mark.parametrize("command", [("report", "merge"), ("policy", "suggest")])
    @pytest.mark.parametrize("body", ["[" * 100_000 + "]" * 100_000, '{"run": ' + "9" * 100_000 + "}"],
                             ids=["nested", "huge-int"])
    def test_a_report_too_deep_or_with_a_huge_integer_is_refused_naming_it(
            self, tmp_path: Path, command: tuple[str, str], body: str) -> None:
        """The JSON parser raises RecursionError past its depth and ValueError on an integer of more
        than 4300 digits: `report merge` and `policy suggest` crashed with a traceback (exit 3)."""
        report = tmp_path / "shard.json"
        report.write_text(body)
        out = vaultsim(tmp_path, *command, str(report), str(report))
        assert 2 == out.returncode, out.stderr[-2000:]
        assert f"{report.name}: not" in out.stderr and "Traceback" not in out.stderr


class TestPytestPluginCollection:
    @pytest.mark.parametrize("kind", ["fifo", "huge-int"])
    def test_a_hostile_yaml_file_beside_the_scenarios_is_not_one_and_does_not_hang(self, tmp_path: Path,
                                                                                   kind: str) -> None:
        """`pytest scenarios/` looks at every YAML file: a FIFO was waited on forever, a huge integer
        crashed collection with a ValueError. Each is now simply not a scenario."""
        from vault.pytest_plugin.scenarios import is_scenario_file
        path = tmp_path / "odd.yaml"
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "huge-int":
            path.write_text("agents: " + "9" * 100_000 + "\n")
        else:
            path.write_text(f"agents:\n{laughs(2)}\n")
        assert is_scenario_file(path, selfcheck=False) is False


def _log_with_a_junk_line(directory: Path, size: int) -> "LogFiles":
    """A real closed log of 20 records with a `size`-byte line (no newline inside) in place of record
    4: sparse, so the test costs no disk, yet a reader sees every byte."""
    from audit_fixtures import make_log
    files = make_log(directory, 20)
    lines = files.lines()
    with open(files.log, "wb") as f:
        f.writelines(line + b"\n" for line in lines[:6])  # records 0-3 and the head signing 3
        f.write(b'{"seq":4,')
        f.seek(size, os.SEEK_CUR)
        f.write(b"\n")
        f.writelines(line + b"\n" for line in lines[6:])
    return files


JUNK_LINE = 512 << 20
READER_CAP = 1 << 30  # address space for a reader of a log holding one JUNK_LINE: about twice it


class TestAuditLogWithAHugeLine:
    def test_verify_names_the_line_in_flat_memory(self, tmp_path: Path) -> None:
        """A half-gigabyte line (an agent outside a jail can append to the log; a disk can hold
        junk) was gathered whole and copied once per 4 MiB read: minutes, then MemoryError
        (exit 3) under a 1 GiB cap. Now `tampered` at the record it replaced, reading no further."""
        files = _log_with_a_junk_line(tmp_path / "log", JUNK_LINE)

        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (READER_CAP, READER_CAP))
        out = subprocess.run([PY, "-m", "vault.cli.main", "audit", "verify", str(files.log), "--json"],
                             capture_output=True, text=True, timeout=300, preexec_fn=cap)
        assert 1 == out.returncode, out.stderr[-2000:]
        report = json.loads(out.stdout)
        assert ("tampered", 4, 4) == (report["status"], report["first_bad_seq"], report["records"])
        assert "not a record or a head" in report["message"]

    def test_show_refuses_the_line_in_flat_memory(self, tmp_path: Path) -> None:
        """`audit show` read each segment whole before looking at a line."""
        files = _log_with_a_junk_line(tmp_path / "log", JUNK_LINE)
        script = ("import sys\nfrom vault.audit.show import decrypt_events\nfrom vault.errors import AuditError\n"
                  "try:\n    decrypt_events(sys.argv[1], bytes.fromhex(sys.stdin.read()))\n"
                  "except AuditError as exc:\n    print(exc)\n")

        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (READER_CAP, READER_CAP))
        out = subprocess.run([PY, "-c", script, str(files.log)], input=files.key.hex(), capture_output=True,
                             text=True, timeout=300, preexec_fn=cap, cwd=ROOT)
        assert 0 == out.returncode, out.stderr[-2000:]
        assert f"damaged record after seq 3 in {files.log}" in out.stdout

    def test_the_writer_reopens_a_log_whose_first_line_is_huge_without_reading_it_whole(self,
                                                                                       tmp_path: Path) -> None:
        """The daemon's start finds where the active segment began by reading its first line,
        which was gathered 64 KiB at a time: 27 s for a 64 MiB line, hours for a gigabyte (the
        daemon never started, never said why). Now one read of at most 1 MiB."""
        from audit_fixtures import make_log
        files = make_log(tmp_path / "log", 20)
        lines = files.lines()
        with open(files.log, "wb") as f:
            f.write(b'{"seq":0,')
            f.seek(JUNK_LINE // 2, os.SEEK_CUR)
            f.write(b"\n")
            f.writelines(line + b"\n" for line in lines[1:])
        script = ("import sys\nfrom pathlib import Path\nfrom cryptography.hazmat.primitives.asymmetric.ed25519 "
                  "import Ed25519PrivateKey\nfrom vault.audit.writer import AuditWriter\n"
                  "key, signing = sys.stdin.read().split()\n"
                  "w = AuditWriter.open(Path(sys.argv[1]), bytes.fromhex(key), "
                  "Ed25519PrivateKey.from_private_bytes(bytes.fromhex(signing)))\nw.close()\nprint('opened')\n")
        from cryptography.hazmat.primitives import serialization
        signing = files.signing_key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                                  serialization.NoEncryption())

        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (READER_CAP, READER_CAP))
        # a deadline, not a wait: the fixed reader opens at once; the old one needed minutes
        out = subprocess.run([PY, "-c", script, str(files.log)], input=f"{files.key.hex()} {signing.hex()}",
                             capture_output=True, text=True, timeout=60, preexec_fn=cap, cwd=ROOT)
        assert "opened" == out.stdout.strip(), out.stderr[-2000:]


HOLD_SUBSCRIBERS = r"""
import json, socket, sys
path, token, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
held = []
for i in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once: the backlog is the daemon's
    s.connect(path)
    s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "approver.hello",
                          "params": {"token": token, "name": f"stopped-{i}"}}).encode() + b"\n"
              + b'{"jsonrpc":"2.0","id":2,"method":"subscribe","params":{}}\n')
    held.append(s)
print("held", flush=True)
sys.stdin.readline()  # never reads a byte from the daemon
"""

BUSY_AGENT = ("client.open_session('busy', 'run-busy')\ncats = set()\n"
              "for i in range(int(sys.argv[1])):\n"
              "    cats.add(str(client.call('read_issue', {'issue_id': 'ISS-1'}).category))\n"
              "out(sorted(cats))\n")


def _fd_hard_limit() -> float:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return float("inf") if hard == resource.RLIM_INFINITY else hard


@pytest.mark.skipif(_fd_hard_limit() < 4096, reason="the open-file hard limit is under 4,096")
class TestManyApproversThatStopReading:
    SUBSCRIBERS = 1000  # four processes (256 connections each at most)
    GROWTH_BOUND = 200 << 20  # the 64 MiB in all, the daemon's own buffers, and room; 1 MiB each was ~420 MiB

    @pytest.mark.timeout(400)
    def test_their_backlogs_are_bounded_in_all_and_a_reader_and_the_agents_go_on(self, sandbox: "Sandbox") -> None:
        """A thousand subscribed approvers that never read (a fleet of stopped scripts) each held up
        to 1 MiB of activity notices: the daemon grew by ~420 MiB while an agent worked, and a
        gigabyte at the approver socket's limit. Now the backlogs together are capped (the largest
        are dropped); an approver that reads stays connected and the agent's calls all succeed."""
        import threading

        import psutil

        from hostile_fixtures import RawClient, frame, hello, setup, spawn_script
        setup(sandbox)
        daemon = psutil.Process(sandbox.status()["pid"])
        token = (sandbox.home / "approver.token").read_text().strip()
        holders = [sandbox.spawn([PY, "-c", HOLD_SUBSCRIBERS, str(sandbox.home / "approver.sock"), token,
                                  str(self.SUBSCRIBERS // 4)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                   for _ in range(4)]
        for h in holders:
            assert h.stdout is not None and "held" == h.stdout.readline().strip()
        reader = RawClient(sandbox.home / "approver.sock", timeout=None)  # type: ignore[arg-type]
        hello(sandbox, reader, "reader")
        reader.send(frame("subscribe", {}, rid=2))
        gone = threading.Event()
        answers: list[dict[str, Any]] = []

        def read() -> None:
            while line := reader.file.readline():
                if b'"id"' in line:
                    answers.append(json.loads(line))
            gone.set()
        threading.Thread(target=read, daemon=True).start()
        baseline = daemon.memory_info().rss
        agent = spawn_script(sandbox, BUSY_AGENT, "3000")
        peak = baseline
        while True:
            peak = max(peak, daemon.memory_info().rss)
            try:
                agent.wait(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                continue
        out, err = agent.communicate(timeout=60)
        assert 0 == agent.returncode, err
        assert ['success'] == json.loads(out.splitlines()[-1])
        assert peak - baseline < self.GROWTH_BOUND, f"the daemon grew by {(peak - baseline) >> 20} MiB"
        assert not gone.is_set(), "the approver that reads was dropped"
        reader.send(frame("status", {}, rid=3))
        wait_for(lambda: any(a.get("id") == 3 and "result" in a for a in answers), timeout=30,
                 what="the reading approver's status answer")
        reader.sock.shutdown(socket.SHUT_RDWR)
        reader.close()
        for h in holders:
            h.communicate("stop\n", timeout=60)
