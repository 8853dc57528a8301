"""With the host's network, a jailed agent cannot reach the host's abstract Unix sockets.

Abstract sockets (a name starting with a NUL byte) belong to a network namespace, not the file
system: `--agent-network host` shares the host's, and the jail's mount namespace hides none of
them. A D-Bus session bus on an abstract address, and so the Secret Service, was reachable from
a jailed agent that way (found by the eleventh red-team pass). The jail now scopes abstract
sockets with Landlock (ABI 6, Linux 6.12): only those made inside the jail can be connected to.
"""

from __future__ import annotations

import os
import socket

import pytest

from helpers import PY, Sandbox
from vault.jail.enter import landlock_abi
from vault.jail.probe import problem

pytestmark = [pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}"),
              pytest.mark.skipif(landlock_abi() < 6, reason="no Landlock ABI 6 (Linux 6.12) here")]

KNOCK = """
import socket, sys
name = sys.argv[1].encode()
mine = socket.socket(socket.AF_UNIX)
mine.bind(b"\\0" + name + b"-own")  # its own: still usable
mine.listen(1)
s = socket.socket(socket.AF_UNIX)
s.connect(b"\\0" + name + b"-own")
try:
    socket.socket(socket.AF_UNIX).connect(b"\\0" + name)
    print("reached the host's")
except OSError as exc:
    print("refused", exc.errno)
"""


def test_a_jailed_program_with_host_network_cannot_reach_a_host_abstract_socket(sandbox: Sandbox) -> None:
    sandbox.start_daemon()
    name = f"vaultsim-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX) as host:
        host.bind(b"\0" + name.encode())
        host.listen(1)
        out = sandbox.vaultsim("exec", "--network", "host", "--", PY, "-c", KNOCK, name)
        assert 0 == out.returncode, out.stderr
        assert "refused 1" == out.stdout.strip().splitlines()[-1]  # EPERM
        unjailed = sandbox.vaultsim("exec", "--isolation", "none", "--", PY, "-c", KNOCK, name)
        assert "reached the host's" == unjailed.stdout.strip().splitlines()[-1]  # what the jail stops
