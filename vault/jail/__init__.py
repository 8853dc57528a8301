"""The agent jail: "a credential never enters the agent", enforced by the OS.

The vault's claim holds against a cooperative agent by design; against an
agent running as the same user it needs the kernel. Every agent process the
runner starts (and any program under `vaultsim exec`) runs in a bubblewrap
sandbox: its own mount, PID, IPC, UTS, cgroup, user and network namespaces,
the host file system read-only, a private /tmp, no capability; the vault
home, keyrings, trial directory, remote state and approver files absent;
only the agent socket, the task file and a private work dir bound in.

* `spec`   what one jail contains, and the bwrap command that builds it
* `enter`  joining a built jail from a running process, dropping privileges
* `ports`  tripwire listeners on the remote's ports in the jail's own loopback
* `probe`  whether jails work on this machine (`--isolation auto`)
"""

from vault.jail.enter import JailError, run_jailed
from vault.jail.spec import Bind, JailSpec, default_hidden

__all__ = ["Bind", "JailError", "JailSpec", "default_hidden", "run_jailed"]
