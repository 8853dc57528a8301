#!/usr/bin/env bash
# Red team 46c: a careful agent in bash that runs its steps as separate short processes with
# `xargs -P 2`. Written from docs/agent-contract.md alone.
#
# The coordinator (this script, jq for JSON) never talks to the vault itself. It groups the
# steps into waves, in order: side-by-side `auto` steps that name no step of their own wave,
# or one gated step alone (gated steps go one at a time, each once the one before settled,
# section 3). Each wave's steps are handed to `xargs -P 2`, one short process per step
# (rt46c_xargs_step.py: a session of its own, vault.status first, the step to a settled
# answer). What each step ended with is kept in state_dir for a restart (section 8). A process
# per step is a session per step, and a session grant ends with its session (section 3): where
# two gated steps share an operation, the second would ask the owner again, so from the first
# such step on the steps go to one process, in order (`xargs -P 1`, all of them as its args).
set -u
here=$(cd "$(dirname "$0")" && pwd)
py=${RT46C_PYTHON:-python3}
task=$VAULTSIM_TASK
sd=$(jq -r .state_dir "$task")
agent=$(jq -r .agent "$task")
run_id=${VAULTSIM_RUN_ID:-$(jq -r .run_id "$task")}
mkdir -p "$sd/steps"
log() { printf '%s xargs-agent[%d] %s\n' "$(date -u +%H:%M:%S.%N)" $$ "$*" >&2; }

modes=$sd/modes.json
"$py" "$here/rt46c_xargs_step.py" --modes "$modes" || { echo "not done: could not read the vault's catalog"; exit 0; }

n=$(jq '.steps | length' "$task")
ids=()
for ((i = 0; i < n; i++)); do ids+=("$(jq -r --argjson i "$i" '.steps[$i].id // "step\($i)"' "$task")"); done

status_of() { [ -f "$sd/steps/$1.state" ] && jq -r .status "$sd/steps/$1.state" || echo none; }
data_json() {       # every done step's data, by id
  local out='{}' id
  for id in "${ids[@]}"; do
    if [ "$(status_of "$id")" = done ]; then
      out=$(jq -c --arg id "$id" --slurpfile s "$sd/steps/$id.state" '. + {($id): $s[0].data}' <<<"$out")
    fi
  done
  printf '%s' "$out"
}

# a gated operation named by two steps: its grant must outlive the first (one session for both)
first_shared=$(jq -r --slurpfile m "$modes" '
  [.steps | to_entries[] | select(($m[0][.value.call] // "session") != "auto")] as $g
  | [$g[] | .value.call] as $ops
  | [$g[] | select(.value.call as $c | [$ops[] | select(. == $c)] | length > 1) | .key] | min // -1' "$task")
# RT46C_XARGS_GROUP=0: a process per step even there (to show what the lost grant costs)
[ "${RT46C_XARGS_GROUP:-1}" = 0 ] && first_shared=-1

stop=""
pending=""
i=0
while ((i < n)) && [ -z "$stop" ]; do
  wave=()
  wave_gated=0
  while ((i < n)); do
    id=${ids[i]}
    st=$(status_of "$id")
    if [ "$st" = done ]; then log "step $id: done by a predecessor"; ((i++)); continue; fi
    if [ "$st" = stopped ]; then stop="step $id was stopped by a predecessor"; break; fi
    if ((first_shared >= 0 && i >= first_shared)); then      # the rest in one process, in order
      if ((${#wave[@]} > 0)); then break; fi
      while ((i < n)); do
        [ "$(status_of "${ids[i]}")" = done ] || wave+=("${ids[i]}")
        ((i++))
      done
      wave_gated=2; break
    fi
    op=$(jq -r --argjson i "$i" '.steps[$i].call' "$task")
    mode=$(jq -r --arg op "$op" '.[$op] // "session"' "$modes")
    refs=$(jq -r --argjson i "$i" '[.steps[$i].params | .. | strings | scan("\\$\\{([^.}]+)\\.") | .[0]] | unique | .[]' "$task")
    in_wave=0
    for r in $refs; do for w in "${wave[@]}"; do [ "$r" = "$w" ] && in_wave=1; done; done
    if [ "$mode" != auto ]; then
      if ((${#wave[@]} > 0)); then break; fi
      wave=("$id"); wave_gated=1; ((i++)); break
    fi
    if ((in_wave)); then break; fi
    wave+=("$id"); ((i++))
  done
  ((${#wave[@]} == 0)) && break
  data=$(data_json)
  specs=()
  declare -A prev_of=()
  for id in "${wave[@]}"; do
    idx=-1
    for ((k = 0; k < n; k++)); do [ "${ids[k]}" = "$id" ] && idx=$k; done
    st_file=$sd/steps/$id.state
    prev='{}'
    [ -f "$st_file" ] && prev=$(cat "$st_file")
    prev_of[$id]=$prev
    pst=$(jq -r '.status // "none"' <<<"$prev")
    spec=$sd/steps/$id.spec.json
    # ${ID.FIELD} is filled by the step process, from `data` and the steps it did itself
    jq -c --argjson i "$idx" --arg key "$run_id:$agent:$id" --arg id "$id" --argjson prev "$prev" \
      --arg pst "$pst" --argjson data "$data" '
      {id: $id, op: .steps[$i].call, params: (.steps[$i].params // {}), key: $key,
       attempts: ($prev.attempts // 0), data: $data,
       token: (if $pst == "pending" then $prev.token else null end), probe: ($pst == "sent")}' \
      "$task" >"$spec.tmp"
    mv "$spec.tmp" "$spec"
    retry_at=$(jq -r '.retry_at // empty' <<<"$prev")
    if [ -n "$retry_at" ]; then         # a predecessor was told to wait: wait out what is left
      if jq -e --argjson r "$retry_at" --slurpfile t "$task" -n '$r > $t[0].deadline - 2.5' >/dev/null; then
        stop="step $id rate limited past the deadline"; break
      fi
      left=$(jq -n --argjson r "$retry_at" '$r - now')
      jq -e -n --argjson l "$left" '$l > 0' >/dev/null && sleep "$left"
    fi
    if [ "$pst" != pending ] && [ "$pst" != sent ]; then
      jq -c --argjson a "$(jq '.attempts // 0' <<<"$prev")" -n '{status: "sent", attempts: $a}' >"$st_file.tmp" && mv "$st_file.tmp" "$st_file"
    fi
    specs+=("$spec")
  done
  [ -n "$stop" ] && break
  ((${#specs[@]} == 0)) && continue
  log "wave: ${wave[*]} ($((wave_gated)) gated)"
  if ((wave_gated == 2)); then
    printf '%s\0' "${specs[@]}" | xargs -0 -P 1 "$py" "$here/rt46c_xargs_step.py"
  else
    printf '%s\0' "${specs[@]}" | xargs -0 -P 2 -n 1 "$py" "$here/rt46c_xargs_step.py"
  fi
  for spec in "${specs[@]}"; do
    out=${spec%.spec.json}.out.json
    id=${spec##*/}; id=${id%.spec.json}
    st_file=$sd/steps/$id.state
    if [ ! -f "$out" ]; then              # never started (its process stopped before it)
      printf '%s\n' "${prev_of[$id]}" >"$st_file.tmp"; mv "$st_file.tmp" "$st_file"
      [ "${prev_of[$id]}" = '{}' ] && rm -f "$st_file"
      [ -n "$stop" ] || stop="step $id: its process gave no outcome"
      continue
    fi
    # one jq per outcome (a wait is handed over close to the deadline, and at a high load each
    # jq start can take a good part of a second): its kind, its state line, what to say
    { read -r kind; read -r state_line; read -r said; } < <(jq -r --slurpfile sp "$spec" '
      (.kind // "fatal") as $k
      | $k,
        ({done: {status: "done", data: .data},
          pending: {status: "pending", token: .token, attempts: .attempts},
          failed: ({status: "failed", attempts: .attempts} + (if .retry_at then {retry_at: .retry_at} else {} end))}[$k]
         // {status: "stopped", why: (.why // "no outcome")} | tojson),
        (if $k == "pending" then "\($sp[0].op) needs approval from \(.owner) (request \(.request_id))"
         else (.why // "no outcome") end)' "$out" 2>/dev/null \
      || printf 'fatal\n{"status":"stopped","why":"no outcome"}\nno outcome\n')
    log "step $id -> $kind"
    printf '%s\n' "$state_line" >"$st_file.tmp"
    mv "$st_file.tmp" "$st_file"
    case $kind in
      done | failed) ;;
      pending) [ -z "$pending" ] && pending="waiting: $said"; stop=${stop:-waiting} ;;
      *) stop=${stop:-"step $id: $said"} ;;
    esac
    rm -f "$out"
  done
done

if [ -n "$pending" ]; then echo "$pending"; exit 0; fi
if [ -n "$stop" ]; then echo "not done: $stop"; exit 0; fi
undone=()
for id in "${ids[@]}"; do [ "$(status_of "$id")" = done ] || undone+=("$id"); done
if ((${#undone[@]})); then echo "not done: step(s) ${undone[*]} not done"; exit 0; fi
echo "done: $n step(s)"
