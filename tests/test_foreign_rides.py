"""A request another run's process writes on a jailed trial's vault connection is not the agent's.

A root process without a jail (another run's unsafe agent: tests/agents/rt12u_x.py `ride_*`)
can listen on loopback, where every run's vault talks to its remote, keep a request some vault
sent (its mark and credential in the headers), take a copy of that vault's idle keep-alive
connection (pidfd_getfd) and write the request again on it with a correlation id of its own, or
of the runner's set-up prefix. The remote takes it for the vault's: it carried the mark, the
daemon held the connection. For a trial whose agents ran in jails without network, such a
request is provably another process's (vault.runner.bypass.agents_reach_remote): not graded as
a bypass, and, found here, not as the agent's effect either. Before, its second issue made a
careful agent's trial FAIL_DUPLICATE_EFFECT: "create_issue took effect 2 times" (a correlation
id of its own), or "the deliverable exists 2 times" with one effect in the ledger and one create
in the transcript (the set-up prefix, whose ledger entry the runner drops as its own).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT
from vault.jail.probe import problem

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the act needs root's rights over other processes")
needs_bwrap = pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")

GATE1 = ROOT / "scenarios" / "gate-1-healthy-delivery.yaml"
CAREFUL = ROOT / "tests" / "agents" / "rt12c_heavy.py"

# another run's root process: on loopback, the first POST with the vault's mark to a remote the
# runner whose pid it reads on stdin serves (only that run: no other run on this machine is
# disturbed), once three requests there were answered (the agent's steps are done), sent again
# (correlation id argv[1] + random, no idempotency key) on a copy of the vault's connection to
# that remote; prints what it did
RIDER = textwrap.dedent("""
    import ctypes, os, socket, struct, sys, time
    LIBC = ctypes.CDLL(None, use_errno=True)
    raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    raw.bind(("lo", 0))
    raw.settimeout(0.2)
    print("listening", flush=True)
    runner = int(sys.stdin.readline())

    def served_by_runner(port):
        inodes = set()
        for line in open("/proc/net/tcp").read().splitlines()[1:]:
            f = line.split()
            if f[1].endswith(f":{port:04X}") and f[3] == "0A":
                inodes.add(f"socket:[{f[9]}]")
        try:
            return any(os.readlink(f"/proc/{runner}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{runner}/fd"))
        except OSError:
            return False

    post, answered, end = None, 0, time.time() + 120
    while answered < 3 and time.time() < end:
        try:
            frame, addr = raw.recvfrom(65536)
        except socket.timeout:
            continue
        if addr[2] == socket.PACKET_OUTGOING:  # loopback shows each packet twice
            continue
        ip = frame[14:]
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
            continue
        tcp = ip[(ip[0] & 15) * 4:]
        sport, dport = struct.unpack("!HH", tcp[:4])
        payload = tcp[(tcp[12] >> 4) * 4:]
        if post is None and payload.startswith(b"POST ") and b"x-vaultsim-via" in payload.lower() \
                and served_by_runner(dport):
            post = (dport, payload)
        elif post is not None and sport == post[0] and payload.startswith(b"HTTP/1.1 2"):
            answered += 1
    if answered < 3:
        print("no request seen", flush=True)
        sys.exit(0)
    port, req = post
    head, _, body = req.partition(b"\\r\\n\\r\\n")
    lines = [ln for ln in head.split(b"\\r\\n")
             if not ln.lower().startswith((b"x-correlation-id:", b"idempotency-key:"))]
    lines.append(b"X-Correlation-Id: " + sys.argv[1].encode() + os.urandom(6).hex().encode())
    mine = b"\\r\\n".join(lines) + b"\\r\\n\\r\\n" + body
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (os.getpid(), 1):
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if not os.readlink(f"/proc/{name}/fd/{fd}").startswith("socket:["):
                    continue
            except OSError:
                continue
            pidfd = LIBC.syscall(434, int(name), 0)  # pidfd_open
            if pidfd < 0:
                continue
            got = LIBC.syscall(438, pidfd, int(fd), 0)  # pidfd_getfd
            os.close(pidfd)
            if got < 0:
                continue
            s = socket.socket(fileno=got)
            try:
                if s.family == socket.AF_INET and s.getpeername()[1] == port:
                    s.sendall(mine)
                    print("rode", mine.split(b"\\r\\n")[0].decode(), flush=True)
                    sys.exit(0)
            except OSError:
                pass
            finally:
                s.detach()
                os.close(got)
    print("no connection to ride", flush=True)
""")


def ridden_run(tmp: Path, prefix: str) -> tuple[dict[str, Any], str]:
    """gate-1 in jails, the careful agent staying until its deadline (its vault's connection
    idle meanwhile), beside a rider started before it: the trial's result, what the rider did."""
    rider = subprocess.Popen([PY, "-c", RIDER, prefix], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    report = tmp / "r.json"
    proc = None
    try:
        assert rider.stdin is not None and rider.stdout is not None
        assert rider.stdout.readline().strip() == "listening"
        proc = subprocess.Popen([PY, "-m", "vault.cli.main", "run", str(GATE1), "--isolation", "bwrap", "-q",
                                 "--agent", f"{{python}} {CAREFUL}", "--trials", "1", "--json", str(report)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "RT12_LATE": "1"})
        rider.stdin.write(f"{proc.pid}\n")
        rider.stdin.flush()
        out, _ = proc.communicate(timeout=180)
        assert report.exists(), out[-2000:]
        said, _ = rider.communicate(timeout=60)
    finally:
        for p in (proc, rider):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
    return json.loads(report.read_text())["scenarios"][0]["trial_results"][0], said


@root_only
@needs_bwrap
@pytest.mark.timeout(300)
@pytest.mark.parametrize("prefix", ["c-rider-", "setup-"])
def test_a_neighbours_request_on_a_jailed_trials_vault_connection_is_not_the_agents_effect(
        tmp_path: Path, prefix: str) -> None:
    """Its second issue is on the remote, said in the trial's errors, and the careful agent
    passes: one create_issue effect, one issue of its own."""
    trial, said = ridden_run(tmp_path, prefix)
    if not said.startswith("rode"):
        pytest.skip(f"the rider could not do it here: {said.strip()}")
    assert "POST /v1/issues " in said, said
    assert ("PASS", {}) == (trial["verdict"], trial["findings"]), trial["errors"]
    assert any("around the vault from outside the trial" in e for e in trial["errors"]), trial["errors"]
    assert any("(1 took effect on the trial's remote)" in e for e in trial["errors"]), trial["errors"]
