#!/usr/bin/env bash
# Red team 47c: the careful agent (rt47c_core.py) started through the wrappers users really put
# around a program, as a CI job or a shell alias would. Written from docs/agent-contract.md alone.
#
#   rt47c_launch.sh WRAPPERS [core args...]
#
# WRAPPERS is a comma-separated list, outermost first, of:
#   script   script -qec CMD /dev/null: a pty, so the output arrives with \r\n (and whatever the
#            terminal layer adds)
#   stdbuf   stdbuf -oL -eL            nice     nice -n 10        ionice  ionice -c3
#   taskset  taskset -c 0              prlimit  prlimit --nofile=64 --
#   envi     env -i with only PATH and the three VAULTSIM_* variables section 1 names
#   timeout  timeout --foreground -s TERM -k 1 T, T ending 1.5 s before the task's deadline: the
#            agent hands its wait over on SIGTERM (section 4)
#   timeout-int  the same with SIGINT, as a Ctrl-C: the agent withdraws its pending call
#   nohup    nohup (stdout is a pipe here, so it writes no nohup.out)
#   flock    flock -w 5 on a lock file of the run's own in $TMPDIR (or /tmp)
#   none     nothing
# RT47C_PY names the interpreter (default: python3 as PATH finds it before any scrub).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
py=${RT47C_PY:-$(command -v python3)}
wrappers=$1
shift
cmd=("$py" "$here/rt47c_core.py" "$@")

IFS=, read -r -a list <<<"$wrappers"
for ((i = ${#list[@]} - 1; i >= 0; i--)); do    # innermost first, so the first named is outermost
  case ${list[$i]} in
    none) ;;
    stdbuf) cmd=(stdbuf -oL -eL "${cmd[@]}") ;;
    nice) cmd=(nice -n 10 "${cmd[@]}") ;;
    ionice) cmd=(ionice -c3 "${cmd[@]}") ;;
    taskset) cmd=(taskset -c 0 "${cmd[@]}") ;;
    prlimit) cmd=(prlimit --nofile=64 -- "${cmd[@]}") ;;
    nohup) cmd=(nohup "${cmd[@]}") ;;
    envi) cmd=(env -i "PATH=/usr/local/bin:/usr/bin:/bin" "VAULTSIM_SOCKET=$VAULTSIM_SOCKET"
               "VAULTSIM_TASK=$VAULTSIM_TASK" "VAULTSIM_RUN_ID=$VAULTSIM_RUN_ID" "${cmd[@]}") ;;
    flock) lock="${TMPDIR:-/tmp}/rt47c-${VAULTSIM_RUN_ID//\//_}.lock"
           cmd=(flock -w 5 "$lock" "${cmd[@]}") ;;
    timeout) t=$("$py" -c 'import json,os,time; t=json.load(open(os.environ["VAULTSIM_TASK"]))
print(max(0.5, round(t["deadline"] - time.time() - 1.5, 2)))')
             cmd=(timeout --foreground --preserve-status -s TERM -k 1 "$t" "${cmd[@]}") ;;
    timeout-int) t=$("$py" -c 'import json,os,time; t=json.load(open(os.environ["VAULTSIM_TASK"]))
print(max(0.5, round(t["deadline"] - time.time() - 1.5, 2)))')
             cmd=(timeout --foreground --preserve-status -s INT -k 1 "$t" "${cmd[@]}") ;;
    script) printf -v line '%q ' "${cmd[@]}"
            cmd=(script -qec "$line" /dev/null) ;;
    *) echo "not done: unknown wrapper ${list[$i]}"; exit 0 ;;
  esac
done
echo "rt47c launch: ${cmd[*]}" >&2
exec "${cmd[@]}"
