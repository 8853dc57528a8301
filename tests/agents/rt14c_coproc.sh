#!/usr/bin/env bash
# A careful agent written from docs/agent-contract.md alone: bash and jq, the socket reached
# through a bash coproc running a python3 one-liner relay (no socat or nc on the machine).
# Non-blocking approvals (wait_s 0, then call.resume), a lookup before every resend, state in
# state_dir (written there and renamed), the final message printed with a CRLF and trailing blanks.
set -u
TASK=${VAULTSIM_TASK:?}
RUN=${VAULTSIM_RUN_ID:-$(jq -r .run_id "$TASK")}
NAME=$(jq -r .agent "$TASK")
DEADLINE=$(jq -r .deadline "$TASK")
SD=$(jq -r '.state_dir // empty' "$TASK")
ST=${SD:+$SD/rt14-coproc.json}
NSTEPS=$(jq '.steps | length' "$TASK")

now() { date +%s.%N; }
left() { awk -v d="$DEADLINE" -v n="$(now)" 'BEGIN { printf "%.3f", d - n - 1.5 }'; }
has_time() { awk -v l="$(left)" -v w="${1:-0}" 'BEGIN { exit !(l > w) }'; }
log() { printf '%s\n' "$*"; }

state='{"done": {}, "pending": {}}'
[ -n "${ST:-}" ] && [ -s "$ST" ] && state=$(cat "$ST")
save() {
  [ -n "${ST:-}" ] || return 0
  printf '%s' "$state" > "$ST.part" && mv -f "$ST.part" "$ST"
}

coproc VAULT { exec python3 -u -c '
import os, socket, sys, threading
s = socket.socket(socket.AF_UNIX); s.connect(os.environ["VAULTSIM_SOCKET"])
def back():
    f = s.makefile("rb")
    for line in f:
        sys.stdout.buffer.write(line); sys.stdout.flush()
    os._exit(0)
threading.Thread(target=back, daemon=True).start()
for line in sys.stdin.buffer:
    s.sendall(line)
s.close()
os._exit(0)
'; }
RID=0
# rpc METHOD PARAMS_JSON -> R: the answer object (result, or {"__error": message}); run in this
# shell, not in $(...), so the request ids count up
rpc() {
  RID=$((RID + 1))
  jq -cn --arg m "$1" --argjson p "$2" --argjson id "$RID" '{jsonrpc: "2.0", id: $id, method: $m, params: $p}' >&"${VAULT[1]}"
  local line
  while IFS= read -r -t 60 line <&"${VAULT[0]}"; do
    if [ "$(jq -r '.id // empty' <<<"$line" 2>/dev/null)" = "$RID" ]; then
      R=$(jq -c 'if has("error") then {__error: (.error.message // "error")} else .result end' <<<"$line")
      return 0
    fi
  done
  R='{"__error": "the vault closed the connection"}'
}

finish() {
  rpc session.close "$(jq -cn --arg s "$SESSION" '{session_id: $s}')"
  exec {VAULT[1]}>&-
  wait "$VAULT_PID" 2>/dev/null
  printf '%s  \r\n' "$1"
  exit 0
}

rpc session.open "$(jq -cn --arg a "$NAME" --arg r "$RUN" '{agent: $a, run_id: $r, client: {name: "rt14-coproc"}}')"; open=$R
SESSION=$(jq -r '.session_id // empty' <<<"$open")
[ -n "$SESSION" ] || { printf 'not done: no session (%s)\r\n' "$(jq -r .__error <<<"$open")"; exit 0; }
log "session open ($NSTEPS steps)"

for ((i = 0; i < NSTEPS; i++)); do
  step=$(jq -c ".steps[$i]" "$TASK")
  sid=$(jq -r .id <<<"$step"); op=$(jq -r .call <<<"$step")
  if [ "$(jq --arg s "$sid" '.done | has($s)' <<<"$state")" = true ]; then log "skip $sid: done earlier"; continue; fi
  # ${ID.FIELD}: every reference must name a field a finished step gave
  missing=$(jq -r --argjson st "$state" '[.params // {} | .. | strings | scan("\\$\\{([A-Za-z0-9_-]+)\\.([A-Za-z0-9_]+)\\}") | select(($st.done[.[0]] // {})[.[1]] == null) | join(".")] | first // empty' <<<"$step")
  [ -z "$missing" ] || finish "not done: no value for \${$missing} (its step did not finish)"
  params=$(jq -c --argjson st "$state" '(.params // {}) | walk(if type == "string" then gsub("\\$\\{(?<i>[A-Za-z0-9_-]+)\\.(?<f>[A-Za-z0-9_]+)\\}"; $st.done[.i][.f] | tostring) else . end)' <<<"$step")
  key="$RUN:$NAME:$sid"
  call() {
    has_time 0 || finish "not done: no time left before the deadline for $op"
    rpc call "$(jq -cn --arg s "$SESSION" --arg o "$op" --argjson p "$params" --arg k "$key" '{session_id: $s, operation: $o, params: $p, idempotency_key: $k, wait_s: 0}')"
  }
  res=""
  tok=$(jq -r --arg s "$sid" '.pending[$s] // empty' <<<"$state")
  if [ -n "$tok" ]; then
    rpc call.resume "$(jq -cn --arg s "$SESSION" --arg t "$tok" '{session_id: $s, resume_token: $t, wait_s: 0}')"; res=$R
    if jq -e 'has("__error")' <<<"$res" >/dev/null; then
      res=""; state=$(jq -c --arg s "$sid" 'del(.pending[$s])' <<<"$state"); save
    fi
  fi
  [ -n "$res" ] || call; res=$R
  attempts=1
  while :; do
    log "$res"
    if jq -e 'has("__error")' <<<"$res" >/dev/null; then finish "not done: the vault refused $op: $(jq -r .__error <<<"$res")"; fi
    cat=$(jq -r .category <<<"$res"); retry=$(jq -r .retry <<<"$res")
    case "$cat" in
      success)
        state=$(jq -c --arg s "$sid" --argjson d "$(jq -c '.data // {}' <<<"$res")" '.done[$s] = $d | del(.pending[$s])' <<<"$state"); save
        break ;;
      approval_pending)
        tok=$(jq -r .resume_token <<<"$res")
        state=$(jq -c --arg s "$sid" --arg t "$tok" '.pending[$s] = $t' <<<"$state"); save
        if ! has_time 0.3; then
          finish "waiting: $op needs approval from $(jq -r '.owner // "its owner"' <<<"$res") (request $(jq -r '.request_id // "?"' <<<"$res")); token kept in state_dir"
        fi
        w=$(awk -v l="$(left)" 'BEGIN { w = l - 0.2; if (w > 0.5) w = 0.5; if (w < 0) w = 0; printf "%.2f", w }')
        rpc call.resume "$(jq -cn --arg s "$SESSION" --arg t "$tok" --argjson w "$w" '{session_id: $s, resume_token: $t, wait_s: $w}')"; res=$R
        if jq -e 'has("__error")' <<<"$res" >/dev/null; then finish "not done: the approval for $op is no longer known"; fi
        continue ;;
    esac
    case "$retry" in never|human_required) finish "not done: $op answered $cat ($retry); stopped" ;; esac
    if [ "$cat" = outcome_unknown ]; then
      cid=$(jq -r .correlation_id <<<"$res"); said=unknown
      for pause in 0 0.1 0.2 0.4; do
        has_time "$pause" || break
        sleep "$pause"
        rpc lookup "$(jq -cn --arg s "$SESSION" --arg c "$cid" --arg o "$op" '{session_id: $s, correlation_id: $c, operation: $o}')"; ans=$R
        log "$ans"
        said=$(jq -r '.reconciled // "unknown"' <<<"$ans")
        [ "$said" = unknown ] || break
      done
      if [ "$said" = found ]; then
        res=$(jq -c '. + {category: "success", retry: "none", data: ((.data.created // [{}])[0])}' <<<"$ans"); continue
      fi
      [ "$said" = not_found ] && [ "$attempts" -lt 3 ] || finish "not done: the outcome of $op is unknown; a person must inspect it"
      call; res=$R; attempts=$((attempts + 1)); continue
    fi
    [ "$attempts" -lt 3 ] || finish "not done: $op failed $attempts times ($cat)"
    case "$cat" in
      rate_limited)
        d=$(jq -r '.retry_after_s // 1' <<<"$res")
        has_time "$(awk -v d="$d" 'BEGIN { print d + 0.3 }')" || finish "not done: $op rate limited past the deadline"
        sleep "$d" ;;
      vault_locked)
        rpc vault.status '{}'; [ "$(jq -r '.locked // true' <<<"$R")" = false ] || finish "not done: the vault is locked; $op not sent" ;;
      *) [ "$retry" = bounded ] || finish "not done: $op: $cat ($retry)" ;;
    esac
    call; res=$R; attempts=$((attempts + 1))
  done
  log "step $sid ok"
done
finish "done: $NSTEPS steps"
