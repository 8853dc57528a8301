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
DEADLINE=$(jq -r .deadline "$TASK")
STATE=$(jq -r .state_dir "$TASK")/bash-agent.json
[ -f "$STATE" ] || echo '{"done":{},"pending":{}}' > "$STATE"

log() { echo "bash-agent: $*" >&2; }
left() { "$PY" -c "import time,sys; print(max(0.0, float(sys.argv[1]) - time.time()))" "$DEADLINE"; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN{exit !(a<b)}'; }
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
rpc() { # method params-json -> ANSWER (the whole response object)
  NEXT=$((NEXT + 1))
  local t
  t=$(left)
  lt "$t" 0.05 && finish "Stopped:" "deadline reached"
  jq -cn --argjson id $NEXT --arg m "$1" --argjson p "$2" '{jsonrpc:"2.0",id:$id,method:$m,params:$p}' >&"${VAULT[1]}"
  local line
  while IFS= read -r -t "$(awk -v t="$t" 'BEGIN{print t+1}')" line <&"${VAULT[0]}"; do
    if [ "$(jq -r '.id // empty' <<<"$line" 2>/dev/null)" = "$NEXT" ]; then ANSWER=$line; return 0; fi
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
    W=$(awk -v t="$(left)" 'BEGIN{w=t-2; if (w>30) w=30; if (w<0) w=0; print w}')
    if [ -n "$TOKEN" ]; then
      rpc call.resume "$(jq -cn --arg s "$SID" --arg t "$TOKEN" --argjson w "$W" '{session_id:$s,resume_token:$t,wait_s:$w}')"
      if jq -e .error <<<"$ANSWER" >/dev/null; then
        log "$ID: token unknown, calling again"; TOKEN=
        jq --arg id "$ID" 'del(.pending[$id])' "$STATE" > "$STATE.tmp" && mv "$STATE.tmp" "$STATE"
        continue
      fi
    else
      [ $ATTEMPTS -ge 3 ] && finish "Stopped:" "$ID: three attempts failed"
      ATTEMPTS=$((ATTEMPTS + 1))
      rpc call "$(jq -cn --arg s "$SID" --arg o "$OP" --argjson p "$PARAMS" --arg k "$KEY" --argjson w "$W" \
        '{session_id:$s,operation:$o,params:$p,idempotency_key:$k,wait_s:$w}')"
      jq -e .error <<<"$ANSWER" >/dev/null && finish "Stopped:" "$ID: the vault refused the request"
    fi
    R=$(jq -c .result <<<"$ANSWER")
    CAT=$(jq -r .category <<<"$R")
    log "$ID $OP -> $CAT"
    case $CAT in
      success)
        jq --arg id "$ID" --argjson d "$(jq -c '.data // {}' <<<"$R")" '.done[$id]=$d | del(.pending[$id])' "$STATE" > "$STATE.tmp" && mv "$STATE.tmp" "$STATE"
        break ;;
      local_failure|confirmed_failure) TOKEN= ;;
      rate_limited)
        TOKEN=; D=$(jq -r '.retry_after_s // 1' <<<"$R")
        { [ $ATTEMPTS -ge 3 ] || lt "$(left)" "$(awk -v d="$D" 'BEGIN{print d+1}')"; } && finish "Stopped:" "$ID: rate limited"
        sleep "$D" ;;
      vault_locked)
        TOKEN=
        while :; do
          lt "$(left)" 1.5 && finish "Stopped:" "$ID: vault locked"
          rpc vault.status '{}'
          [ "$(jq -r .result.locked <<<"$ANSWER")" = false ] && break
          sleep 0.2
        done ;;
      outcome_unknown)
        TOKEN=; CID=$(jq -r .correlation_id <<<"$R"); REC=unknown
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
        TOKEN=$(jq -r .resume_token <<<"$R")
        jq --arg id "$ID" --arg t "$TOKEN" '.pending[$id]=$t' "$STATE" > "$STATE.tmp" && mv "$STATE.tmp" "$STATE"
        if lt "$(left)" 3; then
          finish "Waiting:" "$ID: $OP needs approval from $(jq -r .owner <<<"$R") before $(jq -r .deadline <<<"$R")"
        fi ;;
      *)
        jq --arg id "$ID" 'del(.pending[$id])' "$STATE" > "$STATE.tmp" && mv "$STATE.tmp" "$STATE"
        finish "Stopped:" "$ID: $CAT" ;;
    esac
  done
done
rpc session.close "$(jq -cn --arg s "$SID" '{session_id:$s}')"
finish "Finished." "all $NSTEPS steps succeeded"
