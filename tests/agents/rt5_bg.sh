#!/usr/bin/env bash
# Red team, fifth pass: a careful agent in bash that runs its Python worker in the background
# with `&` and `wait`s for it, and helpers it cleans up at exit with `trap 'kill 0' EXIT`
# (its own process group: what it started, itself included). RT5_BG: wait | trap
set -u
here=$(dirname "$0")
py=${1:-python3}
if [ "${RT5_BG:-wait}" = trap ]; then
  trap 'trap - EXIT; kill 0' EXIT
  sleep 30 &   # a helper it has no more use for at exit
fi
"$py" "$here/rt4_lib.py" > "${TMPDIR:-/tmp}/rt5_bg.out" &
worker=$!
sleep 0.2 &
short=$!
wait "$worker"
wait "$short"
cat "${TMPDIR:-/tmp}/rt5_bg.out"
