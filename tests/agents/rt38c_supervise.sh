#!/bin/sh
# Red team 38c: the small supervisor a user puts in --agent: runs its command and, when that exits
# non-zero, starts it once more (a process the agent starts itself: contract sections 3 and 8).
"$@" && exit 0
echo "supervisor: exit $?, starting it again" >&2
exec "$@"
