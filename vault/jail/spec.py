"""What one agent's jail looks like, and the bubblewrap command that builds it.

A `JailSpec` is plain data (it crosses the fork server's socket and a
command line as JSON): which host paths are hidden, which are bound in, the
network, the working directory and the tripwire ports. `bwrap_argv` turns it
into the bubblewrap invocation of the sandbox's *holder* (`vault.jail.enter`
joins it):

    bwrap --die-with-parent --new-session --unshare-all --unshare-user --disable-userns
          [--share-net] --cap-drop ALL
          --ro-bind / /  --dev /dev  --proc /proc                  the host, read-only
          --tmpfs /tmp --tmpfs /var/tmp --tmpfs /run               private scratch; no host sockets
          --tmpfs HIDDEN ...                                       vault home, keyrings, data dirs
          --bind|--ro-bind SRC DST ...                              agent socket, task, work dir
          --info-fd N -- /bin/sh -c 'echo; read _'                  the holder: waits, then ends it all

Own mount, PID, IPC, UTS, cgroup, user and (unless `network="host"`) network
namespaces; no capability, no new privileges, no nested user namespace. The
sandbox lives as long as its holder: when the holder's stdin closes, its PID
namespace ends and every process the agent left inside dies with it.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

# A process that left the agent's group and ends on its own this soon after the agent exits was
# not left running: an MCP client starts its server in a session of its own, and the server
# exits once its stdin closes (tens of milliseconds, more on a busy machine).
ESCAPE_GRACE_S = 2.0

Network = Literal["none", "host"]

# always private in a jail: scratch space and where per-user sockets live
# (/run/user/UID holds the D-Bus session bus, i.e. the Secret Service)
PRIVATE = ("/tmp", "/var/tmp", "/run")
HOLDER = "echo; read _"


@dataclass(frozen=True)
class Bind:
    src: str
    dst: str
    rw: bool = False


@dataclass(frozen=True)
class JailSpec:
    network: Network = "none"
    hide: tuple[str, ...] = ()
    binds: tuple[Bind, ...] = ()
    cwd: str = "/"
    # tripwires: loopback ports a jailed connection to is recorded (network "none" only)
    ports: tuple[int, ...] = ()
    port_log: str | None = None
    pids_cgroup: str | None = None  # the keeper moves itself in first: the cap on the tree (vault.jail.pids)
    bwrap: str = field(default_factory=lambda: shutil.which("bwrap") or "bwrap")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JailSpec":
        data = dict(data)
        data["hide"] = tuple(data.get("hide", ()))
        data["binds"] = tuple(Bind(**b) for b in data.get("binds", ()))
        data["ports"] = tuple(int(p) for p in data.get("ports", ()))
        return cls(**data)

    def bwrap_argv(self, info_fd: int) -> list[str]:
        argv = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-all", "--unshare-user",
                "--disable-userns"]
        if self.network == "host":
            argv.append("--share-net")
        argv += ["--cap-drop", "ALL", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for path in PRIVATE:
            if os.path.isdir(path):
                argv += ["--tmpfs", path]
        for path in _outermost(self.hide):
            argv += ["--tmpfs", path]
        for b in self.binds:
            argv += ["--bind" if b.rw else "--ro-bind", b.src, b.dst]
        for path in self._own_install():  # after the binds: one of them may mount over /tmp
            argv += ["--ro-bind", path, path]
        argv += ["--info-fd", str(info_fd), "--", "/bin/sh", "-c", HOLDER]
        return argv


    def _own_install(self) -> list[str]:
        """vaultsim's own interpreter environment and code, read-only, when they sit in a
        directory every jail makes private (a venv or a checkout under /tmp): without them a
        jailed `python` of that venv, or vaultsim itself, is not there. Never a directory
        holding something the spec hides or binds (a trial, a vault home)."""
        from vault.resources import IMPORT_ROOT

        private = tuple(p.rstrip("/") + "/" for p in PRIVATE)
        # a read-only bind of a path onto itself is the same view the install's bind gives (the
        # agent's directory inside the venv): not guarded, or it kept the venv's python out
        binds = [b for b in self.binds if b.rw or b.src != b.dst]
        guarded = [os.path.realpath(p) for p in (*self.hide, *(b.src for b in binds), *(b.dst for b in binds))]
        out: list[str] = []
        for raw in (sys.prefix, str(IMPORT_ROOT)):
            path = os.path.abspath(raw)
            if not path.startswith(private) or not os.path.isdir(path):
                continue
            if any(g == path or g.startswith(path + "/") for g in guarded):
                continue
            if not any(path == o or path.startswith(o + "/") for o in out):
                out.append(path)
        return out


def _outermost(paths: tuple[str, ...]) -> list[str]:
    """Existing directories to hide, minus those already inside a hidden one."""
    hidden = list(PRIVATE)
    out = []
    for raw in sorted({os.path.realpath(p) for p in paths}, key=len):
        if not os.path.isdir(raw) or raw == "/":
            continue
        if any(raw == h or raw.startswith(h.rstrip("/") + "/") for h in hidden):
            continue
        hidden.append(raw)
        out.append(raw)
    return out


def default_hidden(home: Path | None = None) -> tuple[str, ...]:
    """Where this user's vault secrets live: the home, the keyrings, their data dirs."""
    return _user_secrets() + ((str(home),) if home is not None else ())


@functools.lru_cache(maxsize=1)
def _user_secrets() -> tuple[str, ...]:
    import platformdirs

    paths = [platformdirs.user_data_dir("vaultsim"), platformdirs.user_data_dir("vaultsim-keyring"),
             os.path.expanduser("~/.local/share/keyrings")]  # gnome-keyring's own store
    for var in ("VAULTSIM_HOME", "VAULTSIM_KEYRING_DIR", "XDG_RUNTIME_DIR"):
        if os.environ.get(var):
            paths.append(os.environ[var])
    return tuple(paths)
