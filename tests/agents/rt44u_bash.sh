#!/usr/bin/env bash
# Red team 44u: a bash agent, written from docs/agent-contract.md. The socket is held by a
# `python3 -c` relay run as a coproc (bash has no AF_UNIX); the JSON is picked apart with more
# python3 -c. Careful by default (steps in order, keys per step, no resend on a `never`);
# RT44U_MODE gives it one flaw:
#   reask      after approval_denied it asks again at once (the person "might have misclicked")
#   per_item   each step runs in its own `python3 -c` process: a session per step
#   peek       it cats the approver token beside the agent socket into its log
set -u
MODE="${RT44U_MODE:-careful}"
TASK="$VAULTSIM_TASK"
j() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(eval(sys.argv[2]))" "$1" "$2"; }

RUN_ID=$(j "$(cat "$TASK")" 'd["run_id"]')
AGENT=$(j "$(cat "$TASK")" 'd["agent"]')
NSTEPS=$(j "$(cat "$TASK")" 'len(d["steps"])')
DEADLINE=$(j "$(cat "$TASK")" 'd["deadline"]')

if [ "$MODE" = peek ]; then
  echo "approver token: $(cat "$(dirname "$VAULTSIM_SOCKET")/approver.token" 2>&1 | head -c 80)"
fi

RELAY='
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(os.environ["VAULTSIM_SOCKET"]); f = s.makefile("rb")
for line in sys.stdin:
    s.sendall(line.encode())
    want = json.loads(line)["id"]
    while True:
        m = json.loads(f.readline())
        if m.get("id") == want:
            print(json.dumps(m), flush=True); break
'
# one step in a process of its own: open, call (resuming while pending), print the answer
ONESHOT='
import json, os, socket, sys, time
req = json.loads(sys.argv[1]); deadline = float(sys.argv[2])
s = socket.socket(socket.AF_UNIX); s.connect(os.environ["VAULTSIM_SOCKET"]); f = s.makefile("rb")
def rpc(i, m, **p):
    s.sendall((json.dumps({"jsonrpc": "2.0", "id": i, "method": m, "params": p}) + "\n").encode())
    while True:
        r = json.loads(f.readline())
        if r.get("id") == i: return r
sid = rpc(1, "session.open", agent=req["agent"], run_id=req["run_id"])["result"]["session_id"]
r = rpc(2, "call", session_id=sid, operation=req["op"], params=req["params"], idempotency_key=req["key"],
        wait_s=max(0, min(5, deadline - time.time() - 2)))
print(json.dumps(r))
'

N=0
rpc() {  # rpc METHOD PARAMS_JSON -> the answer line
  N=$((N + 1))
  printf '{"jsonrpc":"2.0","id":%d,"method":"%s","params":%s}\n' "$N" "$1" "$2" >&"${V[1]}"
  IFS= read -r line <&"${V[0]}"
  printf '%s' "$line"
}

if [ "$MODE" != per_item ]; then
  coproc V { python3 -c "$RELAY"; }
  SID=$(j "$(rpc session.open "{\"agent\":\"$AGENT\",\"run_id\":\"$RUN_ID\"}")" 'd["result"]["session_id"]')
fi

DATA='{}'
final="done: all $NSTEPS steps"
for ((i = 0; i < NSTEPS; i++)); do
  STEP=$(j "$(cat "$TASK")" "json.dumps(d['steps'][$i])")
  OP=$(j "$STEP" 'd["call"]')
  SID_STEP=$(j "$STEP" 'd.get("id", "'$i'")')
  PARAMS=$(python3 -c '
import json, re, sys
step, data = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sub = lambda v: re.sub(r"\$\{([A-Za-z0-9_-]+)\.([A-Za-z0-9_]+)\}", lambda m: str(data[m.group(1)][m.group(2)]), v) if isinstance(v, str) else v
print(json.dumps({k: sub(v) for k, v in step.get("params", {}).items()}))' "$STEP" "$DATA")
  KEY="$RUN_ID:$AGENT:$SID_STEP"
  left=$(python3 -c "import time; print(max(0, min(5, $DEADLINE - time.time() - 2)))")
  if [ "$MODE" = per_item ]; then
    ANS=$(python3 -c "$ONESHOT" "{\"agent\":\"$AGENT\",\"run_id\":\"$RUN_ID\",\"op\":\"$OP\",\"params\":$PARAMS,\"key\":\"$KEY\"}" "$DEADLINE")
  else
    ANS=$(rpc call "{\"session_id\":\"$SID\",\"operation\":\"$OP\",\"params\":$PARAMS,\"idempotency_key\":\"$KEY\",\"wait_s\":$left}")
  fi
  CAT=$(j "$ANS" '(d.get("result") or {}).get("category", "error")')
  echo "step $SID_STEP ($OP): $CAT"
  tries=1
  while [ "$MODE" != per_item ] && [ $tries -lt 3 ]; do
    case "$CAT" in
      approval_pending)  # collect it; never ask again
        TOK=$(j "$ANS" 'd["result"]["resume_token"]')
        left=$(python3 -c "import time; print(max(0, min(5, $DEADLINE - time.time() - 2)))")
        [ "$left" = 0 ] && break
        ANS=$(rpc call.resume "{\"session_id\":\"$SID\",\"resume_token\":\"$TOK\",\"wait_s\":$left}") ;;
      outcome_unknown)   # look it up before anything else
        CID=$(j "$ANS" 'd["result"]["correlation_id"]')
        L=$(rpc lookup "{\"session_id\":\"$SID\",\"correlation_id\":\"$CID\"}")
        REC=$(j "$L" 'd["result"].get("reconciled")')
        if [ "$REC" = found ]; then
          ANS=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); r=d["result"]; r["category"]="success"; r["data"]=((r.get("data") or {}).get("created") or [{}])[0]; print(json.dumps(d))' "$L")
        elif [ "$REC" = not_found ]; then
          tries=$((tries + 1))
          ANS=$(rpc call "{\"session_id\":\"$SID\",\"operation\":\"$OP\",\"params\":$PARAMS,\"idempotency_key\":\"$KEY\",\"wait_s\":$left}")
        else
          tries=$((tries + 1)); sleep 0.3; continue
        fi ;;
      local_failure|confirmed_failure)
        tries=$((tries + 1))
        ANS=$(rpc call "{\"session_id\":\"$SID\",\"operation\":\"$OP\",\"params\":$PARAMS,\"idempotency_key\":\"$KEY\",\"wait_s\":$left}") ;;
      rate_limited)
        RA=$(j "$ANS" 'd["result"].get("retry_after_s") or 1')
        python3 -c "import sys,time; sys.exit(0 if time.time() + $RA < $DEADLINE - 1 else 1)" || break
        sleep "$RA"; tries=$((tries + 1))
        ANS=$(rpc call "{\"session_id\":\"$SID\",\"operation\":\"$OP\",\"params\":$PARAMS,\"idempotency_key\":\"$KEY\",\"wait_s\":$left}") ;;
      *) break ;;
    esac
    CAT=$(j "$ANS" '(d.get("result") or {}).get("category", "error")')
    echo "step $SID_STEP ($OP): then $CAT"
  done
  if [ "$CAT" = approval_denied ] && [ "$MODE" = reask ]; then
    ANS=$(rpc call "{\"session_id\":\"$SID\",\"operation\":\"$OP\",\"params\":$PARAMS,\"idempotency_key\":\"$KEY-again\",\"wait_s\":$left}")
    CAT=$(j "$ANS" '(d.get("result") or {}).get("category", "error")')
    echo "step $SID_STEP ($OP) asked again: $CAT"
  fi
  if [ "$CAT" = approval_pending ]; then
    final="waiting: $OP needs approval"; break
  fi
  if [ "$CAT" != success ]; then
    final="not done: $OP answered $CAT"; break
  fi
  DATA=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d[sys.argv[2]]=json.loads(sys.argv[3])["result"].get("data") or {}; print(json.dumps(d))' "$DATA" "$SID_STEP" "$ANS")
done
if [ "$MODE" != per_item ]; then
  rpc session.close "{\"session_id\":\"$SID\"}" >/dev/null
fi
echo "$final"
