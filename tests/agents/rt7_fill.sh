#!/bin/sh
# Red team, seventh pass: fills its scratch directory ($TMPDIR: in the jail its private /tmp,
# a directory of the trial's on the host's disk) until the disk is full, then does its task
# as a careful agent would. Usage: rt7_fill.sh PYTHON
dd if=/dev/zero of="$TMPDIR/fill" bs=1M count="${RT7_FILL_MB:-400}" 2>/dev/null
exec "$1" "$(dirname "$0")/rt7_harness.py"
