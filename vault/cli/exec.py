"""`vaultsim exec [--home D] -- CMD ARGS`: run any program as a jailed agent of a running vault.

Like `op run` or `aws-vault exec`, except that the program receives the
vault's agent socket, never a secret: VAULTSIM_SOCKET points at the home's
agent.sock, bound into a bubblewrap jail (vault.jail) in which the vault
home, the keyrings, the user's runtime sockets and /tmp are absent, the file
system is read-only but for a private /tmp and `--workdir`, and there is no
network unless `--network host` (for a program that must reach a model API).
With `--isolation none` the program runs as it is, under the same keeper
(vault.jail.keeper): whatever it leaves running ends when it exits.
The MCP bridge runs the same way: `vaultsim exec -- vaultsim mcp`.

Exit status: the program's own; 126 when the jail could not be built; 2 for
bad input (a program that is not there, not executable, or whose #! line names
no interpreter there is: vault.programs); 1 when no daemon serves the home.
"""

from __future__ import annotations

import argparse
import os
import sys

from vault.cli.main import add_home_arg, path_arg
from vault.errors import BadInput, HomeError
from vault.home import VaultHome

# never handed to a program under exec: other vaults, keyrings, the user's session sockets
_DROP = ("PYTHON_KEYRING_BACKEND", "DBUS_SESSION_BUS_ADDRESS", "SSH_AUTH_SOCK", "GNOME_KEYRING_CONTROL",
         "GPG_AGENT_INFO", "XDG_RUNTIME_DIR")


def configure(p: argparse.ArgumentParser) -> None:
    add_home_arg(p)
    p.add_argument("--network", choices=("none", "host"), default="none",
                   help="the program's network: none (default) or the host's (then bypasses are only detected)")
    p.add_argument("--isolation", choices=("auto", "bwrap", "none"), default="auto",
                   help="auto: a jail where it works, else none with a warning; bwrap: a jail or exit 2; "
                        "none: run the program as it is")
    p.add_argument("--workdir", type=path_arg, help="a directory the program may write (its working directory)")
    p.add_argument("--task", type=path_arg, help="a task file for the program (VAULTSIM_TASK), bound in read-only")
    p.add_argument("--run-id", help="VAULTSIM_RUN_ID for the program")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


def run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else list(args.command)
    if not command:
        raise BadInput("give the program to run: vaultsim exec -- CMD [ARGS...]")
    from pathlib import Path
    from vault.programs import program_problem
    why = program_problem(command[0], Path.cwd())  # as `run --agent`: not executable, a #! interpreter missing
    if why:
        raise BadInput(why)
    for path, what, kind, is_kind in ((args.workdir, "--workdir", "a directory", os.path.isdir),
                                      (args.task, "--task", "a regular file", os.path.isfile)):
        if path and not os.path.exists(path):
            raise BadInput(f"{what}: no such path {path}")
        if path and not is_kind(path):
            raise BadInput(f"{what}: {path} is not {kind}")
    home = VaultHome.resolve(args.home).check()
    if not home.agent_sock.exists():  # main's hint says how to start one
        raise HomeError(f"no vault daemon serves {home.root} (no agent.sock)")
    cwd = os.path.realpath(args.workdir or os.getcwd())
    if _inside(cwd, str(home.root)):
        raise BadInput("the working directory is inside the vault home: run it from elsewhere")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VAULTSIM_") and k not in _DROP}
    env["VAULTSIM_SOCKET"] = str(home.agent_sock)
    if args.task:
        env["VAULTSIM_TASK"] = os.path.realpath(args.task)
    if args.run_id:
        env["VAULTSIM_RUN_ID"] = args.run_id
    from vault.jail.probe import resolve
    mode, _ = resolve(args.isolation, args.network, "vaultsim exec")
    if mode == "none":
        os.chdir(cwd)  # --workdir holds unjailed too
        # under a keeper, as in a jail: whatever the program leaves running ends when it does
        from vault.jail.keeper import exit_like, run_kept
        return exit_like(run_kept(command, env))
    return _jailed(home, command, env, cwd, args)


def _jailed(home: VaultHome, command: list[str], env: dict[str, str], cwd: str,
            args: argparse.Namespace) -> int:
    from vault.jail import Bind, JailError, JailSpec, default_hidden, run_jailed
    from vault.jail import pids
    from vault.jail.keeper import exit_like
    from vault.store.keyring_backend import default_dir

    binds = [Bind(str(home.agent_sock), str(home.agent_sock))]
    if args.task:
        binds.append(Bind(env["VAULTSIM_TASK"], env["VAULTSIM_TASK"]))
    if args.workdir:
        binds.append(Bind(cwd, cwd, rw=True))
    elif any(_inside(cwd, d) for d in ("/tmp", "/var/tmp", "/run")):
        binds.append(Bind(cwd, cwd))  # where it was started, read-only, even in a hidden place
    env["TMPDIR"] = "/tmp"
    # this process is the keeper: it moves in; once it has joined the jail it cannot remove the
    # cgroup, so the next one made removes it (vault.jail.pids.create)
    capped = pids.create("exec")
    spec = JailSpec(network=args.network, hide=(*default_hidden(home.root), str(default_dir())),
                    binds=tuple(binds), cwd=cwd, pids_cgroup=capped)
    try:
        code = run_jailed(spec, command, env)
    except JailError as exc:
        print(f"vaultsim exec: cannot build the jail: {exc.strerror or exc}", file=sys.stderr)
        return 126
    return exit_like(code)


def _inside(path: str, directory: str) -> bool:
    real, d = os.path.realpath(path), os.path.realpath(directory)
    return real == d or real.startswith(d.rstrip("/") + "/")


def main() -> int:
    from vault.cli.main import main as vaultsim_main
    return vaultsim_main(["exec", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
