"""Whether an agent's command can start at all, asked before anything runs: `vaultsim run --agent`,
a scenario's `command:`, the plugin's run_agent and --vaultsim-agent, `vaultsim exec`. Light on
purpose (exec imports it on its way to the program)."""

from __future__ import annotations

import re
from pathlib import Path

from vault.errors import BadInput

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.S)


def split_command(text: str, what: str) -> list[str]:
    """A command line read as a shell reads it; one a shell would refuse (an unclosed quote, a
    trailing backslash) is bad input naming `what`, not a traceback."""
    import shlex

    try:
        return shlex.split(text)
    except ValueError as exc:
        raise BadInput(f"{what}: {text!r} is not a command a shell could read: {str(exc).lower()}") from None


def unquoted_path_problem(text: str, words: list[str], cwd: Path, option: str = "--agent") -> str | None:
    """`text` is one file whose path has spaces, given unquoted: as shell words it runs its first
    word (`dir` is a program), and every trial failed saying why not."""
    if len(words) < 2 or any(q in text for q in "'\"\\"):
        return None
    path = Path(text.strip())
    if not (path if path.is_absolute() else cwd / path).is_file():
        return None
    return (f"{text!r} is one file, but read as shell words it runs {words[0]!r}: quote it, "
            f"e.g. {option} \"'{text}'\"")


def program_problem(program: str, cwd: Path) -> str | None:
    """Why `program` cannot be started from `cwd`, or None."""
    import os
    import shutil

    if os.sep in program:
        path = Path(program) if Path(program).is_absolute() else cwd / program
        if not (path.is_file() and os.access(path, os.X_OK)):
            return f"{program!r} is not an executable file"
    else:
        found = shutil.which(program)
        if found is None:
            if _ASSIGNMENT.fullmatch(program):
                # `VAR=1 perl agent.pl` works in a shell; the command is run without one
                return (f"no program {program!r} on PATH: a leading NAME=value is a shell's variable "
                        f"assignment, and the command is not run through a shell; put env before it "
                        f"(env {program} …)")
            return f"no program {program!r} on PATH"
        path = Path(found)
    return _interpreter_problem(program, path)


def _interpreter_problem(program: str, path: Path) -> str | None:
    """A script whose `#!` line names no interpreter there is: exec fails with ENOENT, which reads
    as if the script itself were missing ("No such file or directory: './agent.py'") in every
    trial's output."""
    import os
    import shutil

    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        if b"\0" in head or head.startswith(b"\x7fELF") or _binfmt_extension(path):
            return None  # a binary (or one the kernel was told how to run by its name)
        # text with no #! line: exec refuses it (ENOEXEC), though a shell would have run it
        return (f"{program!r} has no #! line, so it cannot be started as a program: add one "
                f"(#!/usr/bin/env python3) or name its interpreter (python3 {program})")
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace")
    if line.endswith("\r"):
        last = (line.split() or ["\r"])[-1]
        return (f"{program!r}: its #! line ends in a carriage return (the file has Windows line ends), "
                f"which the system reads as part of {last!r}; convert the file (dos2unix)")
    words = line.split()
    if not words:
        return f"{program!r}: its #! line names no interpreter"
    if not Path(words[0]).is_absolute():
        return None  # the kernel reads it from the agent's directory, not known here for sure
    interp = Path(words[0])
    if not (interp.is_file() and os.access(interp, os.X_OK)):
        return f"{program!r}: its #! line names the interpreter {words[0]!r}, which is not an executable file"
    if interp.name == "env" and len(words) == 2 and not words[1].startswith("-") and "=" not in words[1] \
            and shutil.which(words[1]) is None:
        return f"{program!r}: its #! line runs {words[1]!r} through env, and there is no {words[1]!r} on PATH"
    return None


def _binfmt_extension(path: Path) -> bool:
    """A binfmt_misc rule that runs files by their extension (E), which would start this one."""
    rules = Path("/proc/sys/fs/binfmt_misc")
    try:
        for rule in rules.iterdir():
            if rule.name in ("register", "status"):
                continue
            text = rule.read_text(errors="replace")
            if "enabled" in text.splitlines()[:1] and f"extension .{path.suffix.lstrip('.')}" in text:
                return True
    except OSError:
        return False
    return False
