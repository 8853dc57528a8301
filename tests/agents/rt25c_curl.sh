#!/usr/bin/env bash
# A careful agent written from docs/agent-contract.md alone (red team 25, c): bash, with
#  * the vault connection held by `curl --unix-socket SOCK telnet://vault` in a coproc (curl's
#    telnet client is a plain byte relay; JSON in UTF-8 never holds the telnet escape byte 0xFF);
#  * every JSON frame built and read by a `python3 -c` one-liner (no jq);
#  * its state in an SQLite database in state_dir through the `sqlite3` command-line tool;
#  * `vault.status` and `catalog` read first; a `lookup` by idempotency key before every resend;
#  * a verbose transcript: each request and answer on stdout, ids and tokens redacted its own way
#    (`s-4f…[redacted 22]`);
#  * its final message a Markdown report: a table of the steps, then `**Status:** WORD — why`.
# Knobs: RT25C_WAIT=block (one long wait_s, default) | poll (wait_s 0, then call.resume with short
# waits); RT25C_FINAL=report (default) | kv (the report ending in a `| Status | WORD |` table).
set -u
export LC_ALL=C.UTF-8

TASK=${VAULTSIM_TASK:?}
SOCK=${VAULTSIM_SOCKET:?}
WAITSTYLE=${RT25C_WAIT:-block}
FINAL=${RT25C_FINAL:-report}

# --- the task, read once into shell variables -------------------------------------------------
eval "$(python3 -c 'import json,sys,shlex
t=json.load(open(sys.argv[1]))
print("AGENT="+shlex.quote(t["agent"])); print("RUN_ID="+shlex.quote(t.get("run_id") or ""))
print("DEADLINE="+repr(float(t["deadline"]))); print("STATE_DIR="+shlex.quote(t.get("state_dir") or ""))
print("NSTEPS=%d" % len(t.get("steps") or []))' "$TASK")" || { echo "not done: the task file is unreadable"; exit 0; }
[ -n "$RUN_ID" ] || RUN_ID=${VAULTSIM_RUN_ID:-}

DB=""
if [ -n "$STATE_DIR" ] && mkdir -p "$STATE_DIR" 2>/dev/null; then
  DB="$STATE_DIR/rt25c.sqlite"
  sqlite3 -batch "$DB" "CREATE TABLE IF NOT EXISTS steps(id TEXT PRIMARY KEY, state TEXT, data TEXT, token TEXT, attempts INTEGER DEFAULT 0, note TEXT);" \
    || DB=""
fi

# clocks in microseconds, from bash's own $EPOCHREALTIME (no process per check)
DEADLINE_US=$(python3 -c 'import sys; print(int(float(sys.argv[1])*1e6))' "$DEADLINE")
now_us() { local t=$EPOCHREALTIME; echo $(( ${t/./} )); }
# true while more than $1 milliseconds are left
time_for() { (( DEADLINE_US - $(now_us) > $1 * 1000 )); }

sqlq() { printf "%s" "${1//\'/\'\'}"; }
db() { [ -n "$DB" ] && sqlite3 -batch "$DB" "$1"; }
db_put() { # id state data token
  db "INSERT INTO steps(id,state,data,token) VALUES('$(sqlq "$1")','$(sqlq "$2")','$(sqlq "$3")','$(sqlq "$4")')
      ON CONFLICT(id) DO UPDATE SET state=excluded.state, data=excluded.data, token=excluded.token;" ; }
db_get() { db "SELECT $2 FROM steps WHERE id='$(sqlq "$1")';" ; }

# --- the relay --------------------------------------------------------------------------------
coproc VAULT { exec curl -sN --unix-socket "$SOCK" telnet://vault 2>/dev/null; }
VAULT_IN=${VAULT[1]}; VAULT_OUT=${VAULT[0]}; VAULT_PID=$VAULT_PID
NEXT_ID=0
ANSWER=""

# one python3 per frame: the request line and its redacted view (ids and tokens shown by their
# first 4 characters); the answer's fields and its redacted view likewise
REDACT='import re
def red(m): v=m.group(2); return m.group(1)+"\""+v[:4]+"…[redacted %d]\"" % (len(v)-4)
def view(s): return re.sub(r"(\"(?:session_id|resume_token|correlation_id|request_id|diagnostic_id)\": ?)\"([^\"]*)\"", red, s)
'

# rpc METHOD PARAMS_JSON [READ_TIMEOUT] -> ANSWER (the whole frame) ; returns 1 on no answer
rpc() {
  local method=$1 params=$2 limit=${3:-30} req shown line
  NEXT_ID=$((NEXT_ID + 1))
  { IFS= read -r req; IFS= read -r shown; } < <(python3 -c "$REDACT"'
import json,sys
r=json.dumps({"jsonrpc":"2.0","id":int(sys.argv[1]),"method":sys.argv[2],"params":json.loads(sys.argv[3])})
print(r); print(view(r))' "$NEXT_ID" "$method" "$params")
  # nothing is sent after the deadline (a session.close or a lookup included)
  time_for 150 || { echo "rt25c: $method not sent: the deadline is too near"; return 1; }
  printf '→ %s\n' "$shown"
  printf '%s\n' "$req" >&"$VAULT_IN" || { echo "rt25c: the relay is gone"; return 1; }
  # curl's telnet relay hands on what the socket brought only when its stdin stirs: a blank
  # line every 0.2 s while we wait (the vault skips blank lines)
  local give_up=$(( $(now_us) + limit * 1000000 ))
  (( give_up > DEADLINE_US + 500000 )) && give_up=$(( DEADLINE_US + 500000 ))
  local part=""  # a read that times out keeps what it got of a line: carry it on
  while :; do
    local rc=0
    IFS= read -r -t 0.2 line <&"$VAULT_OUT" || rc=$?
    if (( rc != 0 )); then
      (( rc > 128 )) || break  # EOF: the relay is gone
      part+=$line
      (( $(now_us) < give_up )) || break
      printf '\n' >&"$VAULT_IN" 2>/dev/null || break
      continue
    fi
    line=$part$line; part=""
    line=${line%$'\r'}
    # answers are matched by id (the vault writes `"id":N` first; other lines are ignored)
    [[ $line =~ ^\{\"jsonrpc\":\ ?\"2\.0\",\ ?\"id\":\ ?([0-9]+)[,}] ]] || continue
    [ "${BASH_REMATCH[1]}" = "$NEXT_ID" ] || continue
    ANSWER=$line
    result_vars
    printf '← %s\n' "$R_SHOW"
    return 0
  done
  echo "rt25c: no answer to $method"
  return 1
}

# read a Result (or error) into R_* shell variables
result_vars() {
  eval "$(printf '%s' "$ANSWER" | python3 -c "$REDACT"'
import json,sys,shlex
raw=sys.stdin.read(); d=json.loads(raw); r=d.get("result"); r=r if isinstance(r,dict) else {}; e=d.get("error")
data=r.get("data"); created=(data or {}).get("created") if isinstance(data,dict) else None
v={"R_ERR": (json.dumps(e) if e is not None else ""), "R_OK": str(r.get("ok","")), "R_CAT": r.get("category",""),
   "R_RETRY": r.get("retry",""), "R_CID": r.get("correlation_id",""), "R_REC": r.get("reconciled",""),
   "R_TOKEN": r.get("resume_token") or "", "R_AFTER": r.get("retry_after_s") if r.get("retry_after_s") is not None else "",
   "R_OWNER": r.get("owner") or "", "R_DEADLINE": r.get("deadline") or "", "R_REQ": r.get("request_id") or "",
   "R_DATA": json.dumps(data) if data is not None else "",
   "R_CREATED0": json.dumps(created[0]) if isinstance(created,list) and created and isinstance(created[0],dict) else "",
   "R_LOCKED": str(r.get("locked","")), "R_SID": r.get("session_id",""), "R_SHOW": view(raw)}
for k,x in v.items(): print(k+"="+shlex.quote(str(x)))')"
}

pyjson() { python3 -c 'import json,sys; print(json.dumps(dict(zip(sys.argv[1::2], sys.argv[2::2]))))' "$@"; }

# --- finish -----------------------------------------------------------------------------------
ROWS=()
finish() { # word why
  local word=$1 why=$2
  if [ -n "${SID:-}" ] && time_for 1500; then rpc session.close "$(pyjson session_id "$SID")" 1 >/dev/null || true; fi
  exec {VAULT_IN}>&- 2>/dev/null
  kill "$VAULT_PID" 2>/dev/null; wait "$VAULT_PID" 2>/dev/null
  echo
  echo "## rt25c run report"
  echo
  echo "| step | operation | result |"
  echo "|---|---|---|"
  local r; for r in "${ROWS[@]}"; do echo "$r"; done
  echo
  if [ "$FINAL" = kv ]; then
    echo "| Key | Value |"; echo "| --- | --- |"; echo "| Agent | $AGENT |"; echo "| Why | $why |"; echo "| Status | $word |"
  else
    echo "**Status:** $word — $why"
  fi
  exit 0
}

# --- session, status, catalog -----------------------------------------------------------------
SID=""
rpc session.open "$(python3 -c 'import json,sys; print(json.dumps({"agent":sys.argv[1],"run_id":sys.argv[2],"client":{"name":"rt25c-curl","version":"1"}}))' "$AGENT" "$RUN_ID")" \
  || finish "not done" "no answer from the vault to session.open"
[ -z "$R_ERR" ] && SID=$R_SID
[ -n "$SID" ] || finish "not done" "the vault refused the session"
rpc vault.status '{}' 5
LOCKED=$R_LOCKED
rpc catalog '{}' 5 >/dev/null || true

wait_unlocked() { # poll vault.status until it says unlocked; false if the deadline comes first
  while [ "$LOCKED" = True ]; do
    time_for 1000 || return 1
    sleep 0.3
    rpc vault.status '{}' 5 && LOCKED=$R_LOCKED
  done
  return 0
}
wait_unlocked || finish "not done" "the vault stayed locked until the deadline"

NEVER=" authentication_failed authorization_denied malformed_response approval_denied approval_expired approval_unroutable "

# --- one step -----------------------------------------------------------------------------------
# returns via STEP_STATE: done | failed | stop | waiting ; STEP_WHY
STEP_STATE=""; STEP_WHY=""; WAIT_NOTE=""
settle() { # the current R_* answer for step $1: sets SETTLE (done|resend|stop|pending|failed|lockwait|delay|unknown)
  local sid=$1
  if [ -n "$R_ERR" ]; then SETTLE=stop; STEP_WHY="the vault answered an error: $R_ERR"; return; fi
  case " $NEVER " in *" $R_CAT "*) SETTLE=stop; STEP_WHY="$R_CAT (retry: $R_RETRY)"; return ;; esac
  case $R_CAT in
    success)
      if [ "$R_REC" = found ]; then SETTLE=done; DATA=${R_CREATED0:-$R_DATA}
      elif [ "$R_REC" = not_found ]; then SETTLE=resend
      elif [ "$R_REC" = unknown ]; then SETTLE=unknown
      else SETTLE=done; DATA=$R_DATA; fi ;;
    approval_pending) SETTLE=pending ;;
    outcome_unknown) SETTLE=unknown ;;
    rate_limited) SETTLE=delay ;;
    local_failure|confirmed_failure) SETTLE=failed ;;
    vault_locked) SETTLE=lockwait ;;
    *) if [ "$R_REC" = unknown ] && [ -n "$R_TOKEN" ]; then SETTLE=pending
       elif [ "$R_REC" = not_found ]; then SETTLE=resend
       elif [ "$R_REC" = found ]; then SETTLE=done; DATA=${R_CREATED0:-$R_DATA}
       else SETTLE=stop; STEP_WHY="unexpected answer $R_CAT"; fi ;;
  esac
}

wait_for() { # the wait_s for a call or resume that may be held for a person: ends 3.5 s before the deadline
  # (each frame costs this agent a python3 start, a few tenths of a second on a busy host)
  if [ "$WAITSTYLE" = poll ]; then echo 1; return; fi
  local ms=$(( (DEADLINE_US - $(now_us)) / 1000 - 3500 ))
  (( ms < 0 )) && ms=0; (( ms > 60000 )) && ms=60000
  printf '%d.%03d' $((ms / 1000)) $((ms % 1000))
}

do_step() { # index
  local i=$1 sid op params key attempts=0 lookups tok
  eval "$(python3 -c 'import json,sys,shlex
t=json.load(open(sys.argv[1])); s=t["steps"][int(sys.argv[2])]
print("sid="+shlex.quote(s["id"])); print("op="+shlex.quote(s["call"])); print("raw="+shlex.quote(json.dumps(s.get("params") or {})))' "$TASK" "$i")"
  key="$RUN_ID:$AGENT:$sid"
  DATA=""
  if [ "$(db_get "$sid" state)" = done ]; then
    DATA=$(db_get "$sid" data); STEP_STATE=done; STEP_WHY="done by a predecessor"; ROWS+=("| $sid | $op | done (kept) |"); return
  fi
  # ${ID.FIELD}: from the kept data of earlier steps; never guessed
  local known; known=$(db "SELECT id, data FROM steps WHERE state='done';" | python3 -c 'import json,sys
out={}
for line in sys.stdin:
    k,_,v=line.rstrip("\n").partition("|")
    try: out[k]=json.loads(v)
    except Exception: pass
print(json.dumps(out))')
  params=$(python3 -c 'import json,re,sys
known=json.loads(sys.argv[2]); miss=[]
def sub(v):
    if isinstance(v,str):
        def one(m):
            d=known.get(m.group(1))
            if isinstance(d,dict) and m.group(2) in d: return str(d[m.group(2)])
            miss.append(m.group(0)); return m.group(0)
        return re.sub(r"\$\{([^.}]+)\.([^}]+)\}", one, v)
    if isinstance(v,list): return [sub(x) for x in v]
    if isinstance(v,dict): return {k:sub(x) for k,x in v.items()}
    return v
p=sub(json.loads(sys.argv[1]))
if miss: sys.exit(3)
print(json.dumps(p))' "$raw" "$known") || { STEP_STATE=failed; STEP_WHY="$sid needs data no finished step gave"; ROWS+=("| $sid | $op | not sent: needs data |"); return; }

  tok=$(db_get "$sid" token)
  local mode=call
  if [ "$(db_get "$sid" state)" = pending ] && [ -n "$tok" ]; then mode=resume; fi
  while :; do
    if ! time_for 600; then
      STEP_STATE=failed; STEP_WHY="the deadline came before $sid was done"
      if [ -n "$tok" ]; then STEP_STATE=waiting; STEP_WHY=${WAIT_NOTE:-$op still waits for its approval}; fi
      break
    fi
    if [ $mode = resume ]; then
      rpc call.resume "$(python3 -c 'import json,sys; print(json.dumps({"session_id":sys.argv[1],"resume_token":sys.argv[2],"wait_s":float(sys.argv[3])}))' "$SID" "$tok" "$(wait_for)")" 90 \
        || { STEP_STATE=stop; STEP_WHY="no answer to call.resume"; break; }
      if [ -n "$R_ERR" ]; then # the vault no longer knows the token: call the step again, with its key
        tok=""; db_put "$sid" new "" ""; mode=call; continue
      fi
    elif [ $mode = call ]; then
      if [ $attempts -ge 3 ]; then STEP_STATE=failed; STEP_WHY="$sid failed 3 times ($R_CAT)"; break; fi
      if [ $attempts -ge 1 ]; then # a lookup before every resend
        mode=lookup; continue
      fi
      attempts=$((attempts + 1))
      db_put "$sid" sent "" ""
      rpc call "$(python3 -c 'import json,sys; print(json.dumps({"session_id":sys.argv[1],"operation":sys.argv[2],"params":json.loads(sys.argv[3]),"idempotency_key":sys.argv[4],"wait_s":float(sys.argv[5])}))' "$SID" "$op" "$params" "$key" "$(wait_for)")" 90 \
        || { STEP_STATE=stop; STEP_WHY="no answer to call"; break; }
    elif [ $mode = lookup ] || [ $mode = reconcile ]; then
      lookups=0
      local of_call=""  # the call's own correlation id (each lookup answer carries one of its own)
      [ $mode = reconcile ] && of_call=$R_CID
      while :; do
        if [ -n "$of_call" ]; then
          rpc lookup "$(pyjson session_id "$SID" correlation_id "$of_call" operation "$op")" 30 || break
        else
          rpc lookup "$(pyjson session_id "$SID" idempotency_key "$key" operation "$op")" 30 || break
        fi
        [ "$R_REC" = unknown ] && [ -z "$R_TOKEN" ] && [ "$R_CAT" != approval_pending ] || break
        case " $NEVER " in *" $R_CAT "*) break ;; esac
        lookups=$((lookups + 1)); [ $lookups -ge 4 ] && break
        time_for 1000 || break
        sleep "0.$((lookups * 2))"
      done
      if [ "$R_REC" = not_found ] && [ "$R_CAT" != rate_limited ] && ! [[ " $NEVER " == *" $R_CAT "* ]]; then
        # it did not take effect: the same step again, the same key (it counts as an attempt)
        if [ $attempts -ge 3 ]; then STEP_STATE=failed; STEP_WHY="$sid failed 3 times"; break; fi
        attempts=$((attempts + 1)); mode=call
        rpc call "$(python3 -c 'import json,sys; print(json.dumps({"session_id":sys.argv[1],"operation":sys.argv[2],"params":json.loads(sys.argv[3]),"idempotency_key":sys.argv[4],"wait_s":float(sys.argv[5])}))' "$SID" "$op" "$params" "$key" "$(wait_for)")" 90 \
          || { STEP_STATE=stop; STEP_WHY="no answer to call"; break; }
      elif [ "$R_REC" = unknown ] && [ -z "$R_TOKEN" ] && ! [[ " $NEVER " == *" $R_CAT "* ]] && [ "$R_CAT" != rate_limited ]; then
        STEP_STATE=stop; STEP_WHY="$sid: the remote cannot tell whether it took effect; a person must inspect it"; break
      fi
      mode=call
    fi
    settle "$sid"
    case $SETTLE in
      done) db_put "$sid" done "$DATA" ""; STEP_STATE=done; STEP_WHY=""; ROWS+=("| $sid | $op | done |"); return ;;
      stop) db_put "$sid" stopped "" ""; STEP_STATE=stop; ROWS+=("| $sid | $op | stopped: $R_CAT |"); return ;;
      pending)
        tok=$R_TOKEN; db_put "$sid" pending "" "$tok"; mode=resume
        WAIT_NOTE="$op needs approval from ${R_OWNER:-its owner} before $(date -u -d "@${R_DEADLINE%.*}" +%FT%TZ 2>/dev/null || echo "$R_DEADLINE") (request ${R_REQ:-?})"
        if ! time_for $([ "$WAITSTYLE" = poll ] && echo 2000 || echo 3000); then STEP_STATE=waiting; STEP_WHY=$WAIT_NOTE; ROWS+=("| $sid | $op | waiting for approval |"); return; fi
        [ "$WAITSTYLE" = poll ] && sleep 0.2
        ;;
      unknown) mode=reconcile ;;
      resend) mode=call ;;
      failed) mode=call ;;
      delay)
        local after=${R_AFTER:-1}
        if python3 -c 'import sys,time; sys.exit(0 if time.time()+float(sys.argv[2])+0.6 < float(sys.argv[1]) else 1)' "$DEADLINE" "$after"; then
          sleep "$after"; mode=call
        else STEP_STATE=failed; STEP_WHY="$sid rate limited past the deadline"; break; fi ;;
      lockwait)
        LOCKED=True
        wait_unlocked || { STEP_STATE=failed; STEP_WHY="the vault stayed locked until the deadline"; break; }
        mode=call ;;
    esac
  done
  ROWS+=("| $sid | $op | $STEP_STATE |")
}

# --- the steps, in order -----------------------------------------------------------------------
FAILED=0; WAITING=""
for ((i = 0; i < NSTEPS; i++)); do
  do_step "$i"
  case $STEP_STATE in
    done) ;;
    stop) finish "not done" "$STEP_WHY" ;;
    waiting) WAITING=$STEP_WHY; break ;;
    *) FAILED=$((FAILED + 1)); FAIL_WHY=$STEP_WHY ;;
  esac
done
[ -n "$WAITING" ] && finish "waiting" "$WAITING"
[ $FAILED -eq 0 ] && finish "done" "all $NSTEPS steps succeeded"
finish "not done" "$FAILED step(s) failed: $FAIL_WHY"
