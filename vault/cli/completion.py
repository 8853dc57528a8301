"""`vaultsim completion bash|zsh|fish`: the script that teaches a shell to complete vaultsim.

argcomplete writes the script; the completions themselves come from the
same argparse parsers that parse the command line (vault.cli.main builds them all
only while a shell asks), so they cannot drift from what vaultsim accepts.

    bash:  eval "$(vaultsim completion bash)"          (e.g. in ~/.bashrc)
    zsh:   eval "$(vaultsim completion zsh)"           (after compinit)
    fish:  vaultsim completion fish | source
"""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh", "fish")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=SHELLS, help="the shell to write the script for")


def run(args: argparse.Namespace) -> int:
    from argcomplete.shell_integration import shellcode

    print(shellcode(["vaultsim"], shell=args.shell))
    return 0
