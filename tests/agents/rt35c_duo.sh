#!/bin/sh
# A careful agent made of two cooperating programs, written from docs/agent-contract.md alone:
# this POSIX sh driver and a Python helper (rt35c_step.py) it runs once per batch of steps.
#
# The driver holds no connection and no session. Each helper process opens its own connection
# and session, does its batch in order and closes them when it exits (section 3: a session is its
# process's; nothing hands one on). What one helper leaves the next (and a restart) is files in
# state_dir, each replaced whole by a rename (section 1). The helper's plan keeps every step of a
# session-granted operation in one process, so one grant covers them (section 3).
# The final message is the helper's `final`, printed last; helpers log to stderr only.
set -u
here=$(cd "$(dirname "$0")" && pwd)
py=${RT35C_PYTHON:-python3}
step() { "$py" "$here/rt35c_step.py" "$@"; }

plan=$(step plan) || plan=""
# Each line of the plan is one batch; the helper's exit code says whether to go on.
oldifs=$IFS
IFS='
'
for batch in $plan; do
    IFS=$oldifs
    # shellcheck disable=SC2086 # the batch is a list of indexes
    step run $batch
    rc=$?
    tries=1
    # a helper that died (not 0, 3 or 4) is run again on its batch: its successor reads the
    # state files and looks up what the dead one sent (up to 3 tries a step of the batch)
    set -- $batch
    most=$(( $# * 3 + 1 ))
    [ -n "${RT35C_NORERUN:-}" ] && most=0  # a driver that never runs a dead helper's batch again
    while [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ] && [ "$rc" -ne 4 ] && [ "$tries" -lt "$most" ]; do
        # shellcheck disable=SC2086
        step run $batch
        rc=$?
        tries=$((tries + 1))
    done
    IFS='
'
    case $rc in
        0) ;;
        *) break ;;  # 3: the task stopped; 4: the deadline came; else the helper failed
    esac
done
IFS=$oldifs
[ -n "${RT35C_LINGER:-}" ] && sleep "$RT35C_LINGER"  # a twin that idles before its final message
step final
exit 0
