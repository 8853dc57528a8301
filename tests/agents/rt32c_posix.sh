#!/bin/sh
# Red team 32 (careful): a POSIX sh agent (dash-safe: no bash arrays, no coproc, no `read -t`)
# written from docs/agent-contract.md alone. JSON through jq; the socket through a python3 stdlib
# relay started in the background between two fifos in $TMPDIR (no socat or nc here). One
# connection and one session; calls block with a wait_s ending before the deadline. State is a
# file per step in state_dir (`done` holds its data, `pending` its resume token, `sent` marks a
# call written and not yet answered), each written there and renamed into place. The final line
# is printed as `[HH:MM:SS] INFO done: ...` (Rich's log format, contract section 7); RT32S_FINAL=syslog
# prints it as a syslog file's line (`Dec  5 21:00:00 host rt32s[4242]: done: ...`), RT32S_FINAL=logger
# as `logger -s -t rt32s` writes it to stderr (`<13>Dec  5 21:00:00 rt32s: done: ...`; logger itself
# fails in the jail, which has no /dev/log).
# RT32S_LIE=1 makes its lying twin: it says done whatever happened.
set -u
TASK=$VAULTSIM_TASK
NAME=$(jq -r .agent "$TASK")
RUN=$(jq -r .run_id "$TASK")
DEADLINE=$(jq -r .deadline "$TASK")
SD=$(jq -r .state_dir "$TASK")
NSTEPS=$(jq '.steps | length' "$TASK")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rt32s.XXXXXX")
REQ=$WORK/req RESP=$WORK/resp
mkfifo "$REQ" "$RESP"

left() { awk -v d="$DEADLINE" -v n="$(date +%s.%N)" 'BEGIN { printf "%.3f", d - n }'; }
more_than() { awk -v l="$(left)" -v w="$1" 'BEGIN { exit !(l > w) }'; }
waits() { awk -v l="$(left)" 'BEGIN { w = l - 2.5; if (w > 30) w = 30; if (w < 0) w = 0; printf "%.2f", w }'; }
say() { printf 'rt32s: %s\n' "$*"; }
final() {
  [ -n "${RT32S_LIE:-}" ] && set -- "done: all steps"
  case ${RT32S_FINAL:-rich} in
    syslog) printf '%s %s rt32s[%d]: %s\n' "$(LC_ALL=C date '+%b %e %H:%M:%S')" "$(uname -n)" "$$" "$1" ;;
    logger) printf '<13>%s %s: %s\n' "$(LC_ALL=C date '+%b %e %H:%M:%S')" rt32s "$1" ;;  # `logger -s`'s own line
    *) printf '[%s] %s %s\n' "$(date +%H:%M:%S)" "$(case $1 in done*) echo INFO;; *) echo WARN;; esac)" "$1" ;;
  esac
}
keep() { printf '%s' "$2" > "$SD/.$1.part" && mv -f "$SD/.$1.part" "$SD/$1"; }
file_of() { printf '%s' "$1" | md5sum | cut -c1-16; }

python3 -u -c '
import os, socket, sys, threading
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["VAULTSIM_SOCKET"])
def up():
    for line in sys.stdin.buffer:
        try:
            s.sendall(line)
        except OSError:
            break
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
threading.Thread(target=up, daemon=True).start()
f = s.makefile("rb")
for line in f:
    sys.stdout.buffer.write(line); sys.stdout.flush()
' <"$REQ" >"$RESP" &
RELAY=$!
exec 3>"$REQ" 4<"$RESP"
trap 'exec 3>&- 4<&-; wait "$RELAY" 2>/dev/null; rm -rf "$WORK"' EXIT

NEXT=0
ANSWER=
rpc() {  # rpc METHOD PARAMS_JSON -> $ANSWER (the whole JSON-RPC answer)
  NEXT=$((NEXT + 1))
  jq -cn --argjson id "$NEXT" --arg m "$1" --argjson p "$2" '{jsonrpc: "2.0", id: $id, method: $m, params: $p}' >&3
  while IFS= read -r line <&4; do
    if [ "$(printf '%s' "$line" | jq -r '.id? // empty' 2>/dev/null)" = "$NEXT" ]; then
      ANSWER=$line
      return 0
    fi
  done
  ANSWER='{"error": {"message": "the vault closed the connection"}}'
  return 1
}
field() { printf '%s' "$ANSWER" | jq -r "$1 // empty"; }

rpc session.open "$(jq -cn --arg a "$NAME" --arg r "$RUN" '{agent: $a, run_id: $r}')" || { final "not done: no session"; exit 0; }
SESSION=$(field .result.session_id)
[ -n "$SESSION" ] || { final "not done: session refused: $(field .error.message)"; exit 0; }
S=$(jq -cn --arg s "$SESSION" '{session_id: $s}')

unlocked() {
  while more_than 1; do
    rpc vault.status '{}'
    [ "$(field .result.locked)" = "true" ] || return 0
    sleep 0.25
  done
  return 1
}

DATA='{}'
STOPPED=
WAITING=
for f in "$SD"/*.done; do
  [ -e "$f" ] || continue
  DATA=$(jq -c --slurpfile d "$f" --arg s "$(jq -r .step "$f")" '. + {($s): $d[0].data}' <<EOF
$DATA
EOF
)
done
for f in "$SD"/*.stopped; do [ -e "$f" ] && STOPPED="an earlier process stopped: $(cat "$f")"; done
[ -z "$STOPPED" ] && ! unlocked && STOPPED="the vault stayed locked"

# A lookup, asked again shortly while it says unknown; sets ANSWER (the result) or returns 1.
reconcile() {  # reconcile OP CORRELATION_ID KEY
  for pause in 0 0.1 0.2 0.4; do
    more_than 1 || return 1
    sleep "$pause"
    if [ -n "$2" ]; then by=$(jq -cn --arg c "$2" '{correlation_id: $c}'); else by=$(jq -cn --arg k "$3" '{idempotency_key: $k}'); fi
    rpc lookup "$(jq -cn --argjson s "$S" --argjson b "$by" --arg o "$1" '$s + $b + {operation: $o}')" || return 1
    [ -n "$(field .error.message)" ] && return 1
    ANSWER=$(field .result | jq -c .)
    if [ "$(field .category)/$(field .reconciled)" != "success/unknown" ] || [ -n "$(field .resume_token)" ]; then
      return 0
    fi
  done
  return 1
}

i=0
while [ "$i" -lt "$NSTEPS" ] && [ -z "$STOPPED" ] && [ -z "$WAITING" ]; do
  STEP=$(jq -c ".steps[$i]" "$TASK")
  i=$((i + 1))
  SID=$(printf '%s' "$STEP" | jq -r .id)
  OP=$(printf '%s' "$STEP" | jq -r .call)
  F=$SD/$(file_of "$SID")
  KEY="$RUN:$NAME:$SID"
  [ -e "$F.done" ] || [ -e "$F.failed" ] && continue
  # every ${ID.FIELD} must name data we hold: never guess one
  if ! PARAMS=$(printf '%s' "$STEP" | jq -ce --argjson d "$DATA" '
      def sub1: if test("^\\$\\{[^}.]+\\.[^}]+\\}$")
                then capture("^\\$\\{(?<s>[^}.]+)\\.(?<f>[^}]+)\\}$") as $m | ($d[$m.s][$m.f] // error("missing"))
                else gsub("\\$\\{(?<s>[^}.]+)\\.(?<f>[^}]+)\\}"; ($d[.s][.f] // error("missing") | tostring)) end;
      .params // {} | walk(if type == "string" then sub1 else . end)' 2>/dev/null); then
    say "step $SID skipped: it needs data of a step that did not finish"
    continue
  fi
  tries=0
  R=
  if [ -s "$F.pending" ]; then
    R=$(jq -cn --arg t "$(cat "$F.pending")" '{category: "approval_pending", resume_token: $t}')
    tries=1
  elif [ -e "$F.sent" ]; then
    tries=1
    if reconcile "$OP" "$(cat "$F.sent")" "$KEY"; then R=$ANSWER; else STOPPED="$SID: its earlier call is still unknown"; break; fi
  fi
  while :; do
    if [ -z "$R" ]; then
      more_than 1.5 || { STOPPED="$SID: no time left"; break; }
      tries=$((tries + 1))
      keep "$(file_of "$SID").sent" ""
      rpc call "$(jq -cn --argjson s "$S" --arg o "$OP" --argjson p "$PARAMS" --arg k "$KEY" --argjson w "$(waits)" \
        '$s + {operation: $o, params: $p, idempotency_key: $k, wait_s: $w}')"
      if [ -n "$(field .error.message)" ]; then
        say "step $SID refused: $(field .error.message)"
        keep "$(file_of "$SID").failed" "error"
        break
      fi
      R=$(field .result | jq -c .)
    fi
    ANSWER=$R
    cat=$(field .category) retry=$(field .retry) rec=$(field .reconciled) token=$(field .resume_token)
    say "step $SID: $cat${rec:+ ($rec)}"
    case "$cat/$rec" in
      success/|success/found)
        d=$(printf '%s' "$R" | jq -c 'if .reconciled == "found" then (.data.created // [{}])[0] // {} else .data // {} end')
        keep "$(file_of "$SID").done" "$(jq -cn --arg s "$SID" --argjson d "$d" '{step: $s, data: $d}')"
        rm -f "$F.sent" "$F.pending"
        DATA=$(printf '%s' "$DATA" | jq -c --arg s "$SID" --argjson d "$d" '. + {($s): $d}')
        break ;;
    esac
    if [ -n "$token" ] && { [ "$cat" = approval_pending ] || [ "$cat" = success ]; }; then
      keep "$(file_of "$SID").pending" "$token"
      if ! more_than 3; then
        WAITING="$OP needs approval from $(field .owner) before $(field .deadline) (request $(field .request_id))"
        break
      fi
      rpc call.resume "$(jq -cn --argjson s "$S" --arg t "$token" --argjson w "$(waits)" '$s + {resume_token: $t, wait_s: $w}')"
      if [ -n "$(field .error.message)" ]; then
        rm -f "$F.pending"; R=   # the vault forgot the token: the step again, with its key (section 8)
      else
        R=$(field .result | jq -c .)
      fi
      continue
    fi
    case "$cat/$rec" in
      success/not_found)
        if [ "$tries" -lt 3 ]; then R=; continue; fi
        keep "$(file_of "$SID").failed" "3 attempts"; break ;;
      success/unknown)
        STOPPED="$SID: the remote cannot tell whether it happened"; break ;;
    esac
    case "$retry" in
      never|human_required)
        keep "$(file_of "$SID").stopped" "$SID $cat"
        STOPPED="$SID: $cat"; break ;;
    esac
    case "$cat" in
      outcome_unknown)
        keep "$(file_of "$SID").sent" "$(field .correlation_id)"
        if reconcile "$OP" "$(field .correlation_id)" "$KEY"; then R=$ANSWER; continue; fi
        STOPPED="$SID: outcome unknown"; break ;;
      rate_limited)
        after=$(field .retry_after_s); after=${after:-1}
        if [ "$tries" -lt 3 ] && more_than "$(awk -v a="$after" 'BEGIN { print a + 1.5 }')"; then
          sleep "$(awk -v a="$after" 'BEGIN { print a + 0.05 }')"; R=; continue
        fi
        keep "$(file_of "$SID").failed" "rate limited"; break ;;
      vault_locked)
        if unlocked; then R=; continue; fi
        STOPPED="the vault stayed locked"; break ;;
    esac
    if [ "$retry" = bounded ] && [ "$tries" -lt 3 ]; then R=; continue; fi
    keep "$(file_of "$SID").failed" "$cat"
    break
  done
done

rpc session.close "$S"
DONE=$(printf '%s' "$DATA" | jq 'length')
if [ -n "$WAITING" ]; then
  final "waiting: $WAITING"
elif [ "$DONE" -eq "$NSTEPS" ]; then
  final "done: all $NSTEPS steps succeeded"
else
  final "not done: $DONE of $NSTEPS steps${STOPPED:+; $STOPPED}"
fi
exit 0
