"""The remote half of the SSH executor: markers that outlive the connection.

Why: an SSH client that dies after sending a command proves nothing about the
command. So every command runs inside a small POSIX-sh wrapper that leaves
evidence on the host, keyed by a persistent operation id, and a later lookup
reads that evidence instead of guessing.

Remote layout, in the markers dir (`service.options["markers_dir"]`, default
`$HOME/.vaultsim-markers`, created 0700):

    <op>.start  written by the worker BEFORE the command runs, atomically and
                exclusively (`ln` of a complete temp file: exactly one worker
                can claim an op id). Lines: op_id, correlation_id, pid,
                pid_start (Linux /proc start time, guards against pid reuse),
                started_at.
    <op>.done   written AFTER the command exits (temp file + rename):
                exit_status, finished_at.
    <op>.out    the command's stdout/stderr, for an operator on the host only.
    <cid>.ref   correlation id -> op id, when the op id is an idempotency key.

Process shape: sshd runs `sh -s` reading the wrapper on stdin; the wrapper starts the worker detached
(`setsid`, stdio on files, SIGHUP ignored) and waits for it. When the client
dies, sshd closes the session's pipes; the wrapper may die of SIGPIPE, but the
worker shares no session, terminal or pipe with it, so the command finishes
and writes `.done`. A second call with the same op id never runs the command
again: it reports the earlier markers (`duplicate`).

Wrapper stdout protocol (one `vaultsim:` line each; other noise is ignored):

    vaultsim:spawned PID      the worker exists; the command may now run
    vaultsim:done RC          completion marker present, command exited RC
    vaultsim:incomplete WRC   worker ended (wait status WRC) without `.done`
    vaultsim:duplicate        this op id was already started earlier; not rerun
    vaultsim:pending          (after duplicate) ... and has not completed
    vaultsim:error WHAT       markers unusable (markers|start); nothing ran

Lookup prints one line: `vaultsim:lookup found RC OP`, `running PID OP`,
`stopped PID OP` (started, process gone, no `.done`) or `none`.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass

DEFAULT_MARKERS_DIR = ""  # empty: the wrapper uses $HOME/.vaultsim-markers

_SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

_WORKER = r"""
trap '' HUP
base=$1 op_id=$2 cid=$3 cmd=$4
st=
if [ -r "/proc/$$/stat" ]; then st=$(sed 's/^.*) //' "/proc/$$/stat" | cut -d' ' -f20); fi
tmp="$base.start.tmp$$"
if ! printf 'op_id=%s\ncorrelation_id=%s\npid=%s\npid_start=%s\nstarted_at=%s\n' \
    "$op_id" "$cid" "$$" "$st" "$(date +%s)" >"$tmp"; then rm -f "$tmp"; exit 124; fi
if ! ln "$tmp" "$base.start" 2>/dev/null; then
    rm -f "$tmp"
    if [ -e "$base.start" ]; then exit 125; fi
    exit 124
fi
rm -f "$tmp"
sh -c "$cmd"
rc=$?
printf 'exit_status=%s\nfinished_at=%s\n' "$rc" "$(date +%s)" >"$base.done.tmp$$" \
    && mv -f "$base.done.tmp$$" "$base.done" || exit 123
exit 0
"""

_WRAPPER = r"""
set -u
op_id=$1 cid=$2 dir=$3 cmd=$4
[ -n "$dir" ] || dir="${HOME:-}/.vaultsim-markers"
umask 077
if ! mkdir -p "$dir" 2>/dev/null || [ ! -w "$dir" ]; then echo "vaultsim:error markers"; exit 0; fi
base="$dir/$op_id"
[ "$cid" = "$op_id" ] || printf '%s\n' "$op_id" >"$dir/$cid.ref"
status() { sed -n 's/^exit_status=//p' "$base.done"; }
existing() {
    echo "vaultsim:duplicate"
    if [ -e "$base.done" ]; then echo "vaultsim:done $(status)"; else echo "vaultsim:pending"; fi
}
if [ -e "$base.start" ]; then existing; exit 0; fi
if command -v setsid >/dev/null 2>&1; then detach=setsid; else detach=nohup; fi
$detach sh -c "$worker" vaultsim-worker "$base" "$op_id" "$cid" "$cmd" </dev/null >>"$base.out" 2>&1 &
wpid=$!
echo "vaultsim:spawned $wpid"
wait "$wpid"
wrc=$?
case $wrc in
    125) existing ;;
    124) echo "vaultsim:error start" ;;
    *) if [ -e "$base.done" ]; then echo "vaultsim:done $(status)"; else echo "vaultsim:incomplete $wrc"; fi ;;
esac
exit 0
"""

_LOOKUP = r"""
dir=$1
shift
[ -n "$dir" ] || dir="${HOME:-}/.vaultsim-markers"
alive() {
    [ -n "$1" ] || return 1
    if [ -d /proc/self ]; then
        fields=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
        [ -n "$fields" ] || return 1
        case $fields in Z*|X*) return 1 ;; esac
        [ -z "$2" ] || [ "$(printf '%s\n' "$fields" | cut -d' ' -f20)" = "$2" ]
    else
        kill -0 "$1" 2>/dev/null
    fi
}
for name in "$@"; do
    op=$name
    if [ ! -e "$dir/$op.start" ] && [ -f "$dir/$op.ref" ]; then
        op=$(cat "$dir/$op.ref")
        case $op in ''|*[!A-Za-z0-9_-]*) continue ;; esac
    fi
    s="$dir/$op.start" d="$dir/$op.done"
    [ -e "$s" ] || continue
    if [ ! -e "$d" ]; then
        pid=$(sed -n 's/^pid=//p' "$s")
        if alive "$pid" "$(sed -n 's/^pid_start=//p' "$s")"; then
            echo "vaultsim:lookup running $pid $op"; exit 0
        fi
    fi
    # re-check: the worker may have finished between the two reads
    if [ -e "$d" ]; then
        echo "vaultsim:lookup found $(sed -n 's/^exit_status=//p' "$d") $op"; exit 0
    fi
    echo "vaultsim:lookup stopped $pid $op"; exit 0
done
echo "vaultsim:lookup none"
"""


def op_id_for(correlation_id: str | None, idempotency_key: str | None) -> str:
    """The persistent operation id: the idempotency key if given, else the correlation id.

    Agent-chosen text never becomes a path: keys are hashed, and a correlation
    id that is not a plain token is hashed too.
    """
    if idempotency_key:
        return "k-" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:40]
    if not correlation_id:
        raise ValueError("an operation id needs a correlation id or an idempotency key")
    return safe_name(correlation_id)


def safe_name(correlation_id: str) -> str:
    if _SAFE_ID.fullmatch(correlation_id):
        return correlation_id
    return "h-" + hashlib.sha256(correlation_id.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class RemoteCall:
    """A command line for sshd plus the script it reads on stdin.

    The scripts travel on stdin, not in the command line, so the line the
    client logs ("Sending command: ...") and the host's process list stay one
    short line: `sh -s -- ARGS`.
    """

    command: str
    script: str


def execute_call(op_id: str, correlation_id: str, markers_dir: str, command: str) -> RemoteCall:
    """The marker wrapper around `command`, whose parameter values must already be quoted."""
    args = [op_id, safe_name(correlation_id), markers_dir, command]
    script = f"worker={shlex.quote(_WORKER)}\n{_WRAPPER}"
    return RemoteCall(_sh_s(args), script)


def lookup_call(names: list[str], markers_dir: str) -> RemoteCall:
    return RemoteCall(_sh_s([markers_dir, *names]), _LOOKUP)


def _sh_s(args: list[str]) -> str:
    # sshd hands this line to the user's login shell: every argument quoted once
    return "sh -s -- " + " ".join(shlex.quote(a) for a in args)


@dataclass(frozen=True)
class ExecVerdict:
    """What the wrapper reported. `kind` is None when it reported no verdict."""

    kind: str | None  # done | incomplete | pending | error
    spawned_pid: int | None = None
    exit_status: int | None = None  # done: the command's; incomplete: the worker's wait status
    duplicate: bool = False
    error: str | None = None


def parse_execute(lines: list[str]) -> ExecVerdict:
    kind: str | None = None
    pid = status = None
    duplicate = False
    error = None
    for line in lines:
        if not line.startswith("vaultsim:"):
            continue
        word, _, rest = line[len("vaultsim:"):].strip().partition(" ")
        rest = rest.strip()
        if word == "spawned":
            pid = _int(rest)
        elif word == "duplicate":
            duplicate = True
        elif word in ("done", "incomplete"):
            status = _int(rest)
            # a done line without a readable status is not evidence of completion
            kind = word if status is not None else "incomplete"
        elif word == "pending":
            kind = "pending"
        elif word == "error":
            kind, error = "error", rest or "unknown"
    return ExecVerdict(kind, pid, status, duplicate, error)


@dataclass(frozen=True)
class LookupVerdict:
    state: str | None  # found | running | stopped | none; None: no answer
    exit_status: int | None = None
    pid: int | None = None
    op_id: str | None = None


def parse_lookup(lines: list[str]) -> LookupVerdict:
    for line in lines:
        if not line.startswith("vaultsim:lookup "):
            continue
        parts = line.split()[1:]
        state = parts[0] if parts else None
        if state == "none":
            return LookupVerdict("none")
        if state == "found" and len(parts) == 3 and _int(parts[1]) is not None:
            return LookupVerdict("found", exit_status=_int(parts[1]), op_id=parts[2])
        if state == "found":
            # completion marker present but unreadable: completed, status unknown
            return LookupVerdict("found", op_id=parts[-1] if len(parts) > 1 else None)
        if state in ("running", "stopped"):
            pid = _int(parts[1]) if len(parts) > 2 else None
            return LookupVerdict(state, pid=pid, op_id=parts[-1] if len(parts) > 1 else None)
    return LookupVerdict(None)


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None
