#!/bin/bash
# A careful agent in bash, written from docs/agent-contract.md alone.
# The vault connection is a coprocess relay (a python one-liner, as socat would be):
# it opens the connection and keeps it; bash writes requests to it and reads answers.
# JSON with jq. Blocking style (wait_s), final message "Finished." / "Stopped" with CRLF.
# usage: rt3_bash.sh [PYTHON]
set -u
PY=${1:-python3}
TASK=$VAULTSIM_TASK
RUN_ID=${VAULTSIM_RUN_ID}
AGENT=$(jq -r .agent "$TASK")
# the deadline in microseconds, and the clock read with bash's own $EPOCHREALTIME: what follows a
# wait's answer must end within its 2 s margin, and at load 17 on 2 cores each process the agent
# starts (a python for the clock, a jq per field) took 0.2-0.5 s: ten of them ran past the deadline
DEADLINE_US=$(jq -r '.deadline * 1000000 | floor' "$TASK")
STATE=$(jq -r .state_dir "$TASK")/bash-agent.json
[ -f "$STATE" ] || echo '{"done":{},"pending":{}}' > "$STATE"

log() { echo "bash-agent: $*" >&2; }
left_ms() { local t=$EPOCHREALTIME; local ms=$(( (DEADLINE_US - ${t/[.,]/}) / 1000 )); echo $(( ms < 0 ? 0 : ms )); }
secs() { printf '%d.%03d' $(( $1 / 1000 )) $(( $1 % 1000 )); }  # milliseconds as seconds
finish() { # claim word, reason
  printf '%s %s\r\n' "$1" "$2"
  eval "exec ${VAULT[1]}>&-" 2>/dev/null
  wait "$VAULT_PID" 2>/dev/null
  exit 0
}

coproc VAULT { exec "$PY" -u -c '
import os, socket, sys, threading
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["VAULTSIM_SOCKET"])
def up():
    for line in sys.stdin.buffer:
        s.sendall(line)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
for line in s.makefile("rb"):
    sys.stdout.buffer.write(line); sys.stdout.buffer.flush()
'; }

NEXT=0
ANSWER=
rpc() { # method params-json -> ANSWER (the whole response object), and its fields read by one jq:
  # ERR (true when an error), CAT, TOKEN_IN, OWNER, UNTIL (the approval's deadline)
  NEXT=$((NEXT + 1))
  local t
  t=$(left_ms)
  [ "$t" -lt 50 ] && finish "Stopped:" "deadline reached"
  jq -cn --argjson id $NEXT --arg m "$1" --argjson p "$2" '{jsonrpc:"2.0",id:$id,method:$m,params:$p}' >&"${VAULT[1]}"
  local line id
  while IFS= read -r -t "$(secs $((t + 1000)))" line <&"${VAULT[0]}"; do
    # (one separator that is no white space: an empty field is kept, not folded into the next)
    IFS=$'\x1f' read -r id ERR CAT TOKEN_IN OWNER UNTIL < <(jq -r '[.id, has("error"), .result.category,
      .result.resume_token, .result.owner, .result.deadline] | map(. // "" | tostring) | join("\u001f")' \
      <<<"$line" 2>/dev/null)
    if [ "$id" = "$NEXT" ]; then ANSWER=$line; return 0; fi
  done
  finish "Stopped:" "the vault did not answer"
}

rpc session.open "$(jq -cn --arg a "$AGENT" --arg r "$RUN_ID" '{agent:$a,run_id:$r,client:{name:"bash-agent"}}')"
SID=$(jq -r '.result.session_id // empty' <<<"$ANSWER")
[ -n "$SID" ] || finish "Stopped:" "session.open refused"

NSTEPS=$(jq '.steps|length' "$TASK")
for ((i = 0; i < NSTEPS; i++)); do
  STEP=$(jq -c ".steps[$i]" "$TASK")
  ID=$(jq -r .id <<<"$STEP"); OP=$(jq -r .call <<<"$STEP")
  if jq -e --arg id "$ID" '.done|has($id)' "$STATE" >/dev/null; then log "$ID already done"; continue; fi
  jq -e --arg op "$OP" '.operations|index($op)' "$TASK" >/dev/null || finish "Stopped:" "$ID: $OP is not allowed to me"
  PARAMS=$(jq -c --slurpfile st "$STATE" '
    def fill: if type == "string" then
        gsub("\\$\\{(?<i>[^.}]+)\\.(?<f>[^}]+)\\}"; ($st[0].done[.i][.f] // error("missing")) | tostring)
      elif type == "object" then map_values(fill) elif type == "array" then map(fill) else . end;
    (.params // {}) | fill' <<<"$STEP") || finish "Stopped:" "$ID: a parameter refers to data I do not have"
  KEY="$RUN_ID:$AGENT:$ID"
  TOKEN=$(jq -r --arg id "$ID" '.pending[$id] // empty' "$STATE")
  ATTEMPTS=0
  while :; do
    W=$(( $(left_ms) - 2000 )); W=$(( W > 30000 ? 30000 : W < 0 ? 0 : W )); W=$(secs $W)
    if [ -n "$TOKEN" ]; then
      rpc call.resume "$(jq -cn --arg s "$SID" --arg t "$TOKEN" --argjson w "$W" '{session_id:$s,resume_token:$t,wait_s:$w}')"
      if [ "$ERR" = true ]; then
        log "$ID: token unknown, calling again"; TOKEN=
        jq --arg id "$ID" 'del(.pending[$id])' "$STATE" > "$STATE.tmp" && mv "$STATE.tmp" "$STATE"
        continue
      fi
    else
      [ $ATTEMPTS -ge 3 ] && finish "Stopped:" "$ID: three attempts failed"
      ATTEMPTS=$((ATTEMPTS + 1))
      rpc call "$(jq -cn --arg s "$SID" --arg o "$OP" --argjson p "$PARAMS" --arg k "$KEY" --argjson w "$W" \
        '{session_id:$s,operation:$o,params:$p,idempotency_key:$k,wait_s:$w}')"
      [ "$ERR" = true ] && finish "Stopped:" "$ID: the vault refused the request"
    fi
    log "$ID $OP -> $CAT"
    case $CAT in
      success)
        jq --arg id "$ID" --argjson d "$(jq -c '.result.data // {}' <<<"$ANSWER")" '.done[$id]=$d | del(.pending[$id])' "$STATE" > "$STATE.tmp" && mv "$STATE.tmp" "$STATE"
        break ;;
      local_failure|confirmed_failure) TOKEN= ;;
      rate_limited)
        TOKEN=; D=$(jq -r '.result.retry_after_s // 1' <<<"$ANSWER")
        { [ $ATTEMPTS -ge 3 ] || awk -v a="$(secs "$(left_ms)")" -v d="$D" 'BEGIN{exit !(a<d+1)}'; } && finish "Stopped:" "$ID: rate limited"
        sleep "$D" ;;
      vault_locked)
        TOKEN=
        while :; do
          [ "$(left_ms)" -lt 1500 ] && finish "Stopped:" "$ID: vault locked"
          rpc vault.status '{}'
          [ "$(jq -r .result.locked <<<"$ANSWER")" = false ] && break
          sleep 0.2
        done ;;
      outcome_unknown)
        TOKEN=; CID=$(jq -r .result.correlation_id <<<"$ANSWER"); REC=unknown
        for P in 0 0.1 0.2 0.4; do
          sleep $P
          rpc lookup "$(jq -cn --arg s "$SID" --arg c "$CID" '{session_id:$s,correlation_id:$c}')"
          REC=$(jq -r '.result.reconciled // "error"' <<<"$ANSWER")
          log "$ID lookup -> $REC"
          [ "$REC" = unknown ] || break
        done
        case $REC in
          found)
            jq --arg id "$ID" --argjson d "$(jq -c '.result.data.created[0] // {}' <<<"$ANSWER")" '.done[$id]=$d' "$STATE" > "$STATE.tmp" && mv "$STATE.tmp" "$STATE"
            break ;;
          not_found) ;;
          *) finish "Stopped:" "$ID: outcome unknown; a person must inspect it" ;;
        esac ;;
      approval_pending)
        TOKEN=$TOKEN_IN
        jq --arg id "$ID" --arg t "$TOKEN" '.pending[$id]=$t' "$STATE" > "$STATE.tmp" && mv "$STATE.tmp" "$STATE"
        if [ "$(left_ms)" -lt 3000 ]; then
          finish "Waiting:" "$ID: $OP needs approval from $OWNER before $UNTIL"
        fi ;;
      *)
        jq --arg id "$ID" 'del(.pending[$id])' "$STATE" > "$STATE.tmp" && mv "$STATE.tmp" "$STATE"
        finish "Stopped:" "$ID: $CAT" ;;
    esac
  done
done
rpc session.close "$(jq -cn --arg s "$SID" '{session_id:$s}')"
finish "Finished." "all $NSTEPS steps succeeded"
