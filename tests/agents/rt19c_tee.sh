#!/usr/bin/env bash
# A careful agent's launcher as people write them (red team, nineteenth pass, c): bash keeps a
# copy of everything in $TMPDIR through process substitutions (`exec > >(tee …)`), then runs the
# Python agent (rt19c_habits.py) under GNU `timeout` (which puts itself in a process group of
# its own) as a safety net that fires just before the task's deadline.
#   RT19C_WAIT=1: the launcher closes its output and waits for the tee processes before exiting
#   (bash does not wait for a process substitution by itself); else it exits without waiting.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log=${TMPDIR:-/tmp}/rt19c-launch
exec > >(tee -a "$log.out") 2> >(tee -a "$log.err" >&2)
out_pid=$!
# a safety net only: the agent finishes on its own before its deadline; this fires just before it
budget=$(python3 -c 'import json, os, time; print("%.2f" % max(0.5, json.load(open(os.environ["VAULTSIM_TASK"]))["deadline"] - time.time() - 0.15))')
code=0
timeout -k 1 "$budget" python3 -u "$here/rt19c_habits.py" || code=$?
if [ "${RT19C_WAIT:-}" = 1 ]; then
  exec >&- 2>&-
  wait "$out_pid" 2>/dev/null || true
fi
exit "$code"
