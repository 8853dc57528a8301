"""Can this machine jail an agent? Asked once per process, by doing it.

`--isolation auto` uses the jail when this says yes and warns once when it
says no (naming why: no bwrap, user namespaces disabled, a kernel that
refuses to let us join them); `--isolation bwrap` refuses to run without it.
The probe builds a real sandbox and runs `/bin/true` in it the way agents are
run, from a forked child (whoever joins a jail stays in it).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable

from vault.jail.spec import JailSpec


@functools.lru_cache(maxsize=None)
def problem(network: str = "none") -> str | None:
    """None when a jail works here, else why not (one short sentence)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    if not os.path.exists("/proc/self/ns/user"):
        return "this kernel has no namespaces"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(r)
        code = 1
        try:
            from vault.jail.enter import run_jailed
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 1)
            os.dup2(null, 2)
            code = run_jailed(JailSpec(network=network), ["/bin/true"])  # type: ignore[arg-type]
        except OSError as exc:
            os.write(w, (exc.strerror or str(exc)).encode()[:500])
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        why = f.read().decode(errors="replace").strip()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        return None
    return why or "bwrap could not build a sandbox here"


def resolve(choice: str, network: str, prog: str,
            opens_seen: Callable[[], bool] = lambda: False) -> tuple[str, str]:
    """(mode, note) for `--isolation CHOICE`: "bwrap" or "none", and what to tell people.

    auto: the jail where it works, else none with one warning on stderr; bwrap:
    the jail or BadInput (exit 2); none: no jail, said plainly. `opens_seen`, asked only
    without a jail: does the runner see who opens the vault's files (vault.runner.opens)?"""
    import sys

    from vault.errors import BadInput

    if choice == "none":
        return "none", ("agents run without a jail (--isolation none): bypasses are detected by what they "
                        f"lead to, not prevented, and {_reads(opens_seen)}")
    why = problem(network)
    if why is None:
        return "bwrap", ""
    if choice == "bwrap":
        raise BadInput(f"--isolation bwrap: cannot jail agents on this machine: {why}")
    note = (f"agents run without a jail ({why}); bypasses are detected by what they lead to, not "
            f"prevented, and {_reads(opens_seen)}")
    print(f"{prog}: warning: {note}", file=sys.stderr)
    return "none", note


def _reads(opens_seen: Callable[[], bool]) -> str:
    if opens_seen():
        return "opens of the vault's secret files are seen with the process that opened them (fanotify, as root)"
    return "reads of the vault's files go unseen"
