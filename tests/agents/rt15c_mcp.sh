#!/usr/bin/env bash
# A careful agent written from docs/agent-contract.md and README's MCP section alone (red team,
# fifteenth pass): no raw socket. bash and jq drive the documented agent-side tool, `vaultsim
# mcp` (stdio), as a coprocess: initialize, then one tools/call per step (the operation's tool
# with idempotency_key and wait_s), vault_resume for a pending approval, vault_lookup after
# every outcome_unknown (by correlation id, 0.1/0.2/0.4 s apart). State in state_dir (written
# there and renamed). At the end the bridge's stdin is closed and the bridge waited for.
# RT15_VAULTSIM: the vaultsim command (default `vaultsim`). RT15_FINAL: text (default), yaml, or
# tput (coloured with terminfo's sequences: `✔ Status: done (...)` with xterm's sgr0 resets).
set -u
TASK=${VAULTSIM_TASK:?}
DEADLINE=$(jq -r .deadline "$TASK")
SD=$(jq -r '.state_dir // empty' "$TASK")
ST=${SD:+$SD/rt15-mcp.json}
NSTEPS=$(jq '.steps | length' "$TASK")
FINAL=${RT15_FINAL:-text}

now() { date +%s.%N; }
# seconds left before the deadline, less a margin for closing the bridge and exiting
left() { awk -v d="$DEADLINE" -v n="$(now)" 'BEGIN { printf "%.3f", d - n - 1.2 }'; }
has_time() { awk -v l="$(left)" -v w="${1:-0}" 'BEGIN { exit !(l > w) }'; }
log() { printf '%s\n' "$*" >&2; }

state='{"done": {}, "pending": {}}'
[ -n "${ST:-}" ] && [ -s "$ST" ] && state=$(cat "$ST")
save() {
  [ -n "${ST:-}" ] || return 0
  printf '%s' "$state" > "$ST.part" && mv -f "$ST.part" "$ST"
}

# shellcheck disable=SC2086
coproc MCP { exec ${RT15_VAULTSIM:-vaultsim} mcp 2>/dev/null; }
RID=0
# rpc METHOD PARAMS_JSON -> R: the result object, or {"__error": message}
rpc() {
  RID=$((RID + 1))
  jq -cn --arg m "$1" --argjson p "$2" --argjson id "$RID" '{jsonrpc: "2.0", id: $id, method: $m, params: $p}' >&"${MCP[1]}"
  local line wait
  wait=$(awk -v l="$(left)" 'BEGIN { w = l + 1; if (w < 1) w = 1; printf "%d", w }')
  while IFS= read -r -t "$wait" line <&"${MCP[0]}"; do
    if [ "$(jq -r '.id // empty' <<<"$line" 2>/dev/null)" = "$RID" ]; then
      R=$(jq -c 'if has("error") then {__error: (.error.message // "error")} else .result end' <<<"$line")
      return 0
    fi
  done
  R='{"__error": "the bridge did not answer"}'
}
notify() { jq -cn --arg m "$1" '{jsonrpc: "2.0", method: $m}' >&"${MCP[1]}"; }

# tool NAME ARGS_JSON -> RES: the Result (structured content, else the text content's JSON)
tool() {
  rpc tools/call "$(jq -cn --arg n "$1" --argjson a "$2" '{name: $n, arguments: $a}')"
  if jq -e 'has("__error")' <<<"$R" >/dev/null; then
    RES=$(jq -c '{ok: false, category: "rpc_error", message: .__error}' <<<"$R")
  else
    RES=$(jq -c '.structuredContent // (.content[0].text | fromjson? ) // {ok: false, category: "unreadable"}' <<<"$R")
  fi
}

finish() {  # CLAIM WHY
  exec {MCP[1]}>&-
  wait "$MCP_PID" 2>/dev/null
  if [ "$FINAL" = tput ]; then
    # coloured as a shell script colours with terminfo: a mark in colour, a bold label, and a
    # reset on a line of its own at the end (xterm's sgr0 is ESC ( B ESC [ m)
    case "$1" in done) m="✔" ;; waiting) m="…" ;; *) m="✘" ;; esac
    printf '%s%s%s %sStatus:%s %s (%s)\n' "$(tput -T xterm setaf 2)" "$m" "$(tput -T xterm sgr0)" \
      "$(tput -T xterm bold)" "$(tput -T xterm sgr0)" "$1" "$2"
    printf '%s\n' "$(tput -T xterm sgr0)"
  elif [ "$FINAL" = yaml ]; then
    printf 'agent: %s\nreason: %s\nstatus: %s\n' "$(jq -r .agent "$TASK")" "$(jq -Rn --arg w "$2" '$w')" "$1"
  else
    case "$1" in done) w=done ;; waiting) w=waiting ;; *) w="not done" ;; esac
    printf '%s: %s\n' "$w" "$2"
  fi
  exit 0
}

rpc initialize '{"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "rt15c-mcp-sh", "version": "1.0"}}'
if jq -e 'has("__error")' <<<"$R" >/dev/null; then finish not_done "the MCP bridge did not start: $(jq -r .__error <<<"$R")"; fi
notify notifications/initialized
rpc tools/list '{}'
TOOLS=$(jq -c '[.tools[]?.name]' <<<"$R")

# subst PARAMS_JSON -> P (with ${ID.FIELD} replaced from saved step data), or fails
subst() {
  P=$(jq -c --argjson st "$state" '
    def fill: if type == "string" then
        [scan("\\$\\{([A-Za-z0-9_-]+)\\.([A-Za-z0-9_]+)\\}")] as $refs
        | reduce $refs[] as $r (.; if ($st.done[$r[0]] | type) == "object" and ($st.done[$r[0]] | has($r[1]))
                                    then sub("\\$\\{" + $r[0] + "\\." + $r[1] + "\\}"; ($st.done[$r[0]][$r[1]] | tostring))
                                    else error("missing " + $r[0] + "." + $r[1]) end)
      elif type == "object" then map_values(fill) elif type == "array" then map(fill) else . end;
    fill' <<<"$1" 2>/dev/null)
}

waitarg() { awk -v l="$(left)" -v m="$1" 'BEGIN { w = l - 0.3; if (w > m) w = m; if (w < 0) w = 0; printf "%.1f", w }'; }

for ((i = 0; i < NSTEPS; i++)); do
  STEP=$(jq -c ".steps[$i]" "$TASK")
  SID=$(jq -r .id <<<"$STEP"); OP=$(jq -r .call <<<"$STEP")
  if jq -e --arg s "$SID" '.done | has($s)' <<<"$state" >/dev/null; then log "$SID: done earlier"; continue; fi
  jq -e --arg o "$OP" 'index($o)' <<<"$(jq -c .operations "$TASK")" >/dev/null || finish not_done "$SID: $OP is not mine"
  jq -e --arg o "$OP" 'index($o)' <<<"$TOOLS" >/dev/null || finish not_done "$SID: the bridge offers no $OP tool"
  subst "$(jq -c '.params // {}' <<<"$STEP")" || finish not_done "$SID: a parameter needs data I do not have"
  KEY="$(jq -r .run_id "$TASK"):$(jq -r .agent "$TASK"):$SID"
  attempts=0
  TOKEN=$(jq -r --arg s "$SID" '.pending[$s] // empty' <<<"$state")
  RES=''
  if [ -n "$TOKEN" ]; then
    tool vault_resume "$(jq -cn --arg t "$TOKEN" --argjson w "$(waitarg 2)" '{resume_token: $t, wait_s: $w}')"
    if [ "$(jq -r .category <<<"$RES")" = rpc_error ] || [ "$(jq -r .category <<<"$RES")" = local_failure ] && \
       jq -e '.message | test("token"; "i")' <<<"$RES" >/dev/null; then
      log "$SID: the saved token is not known: calling again, same key"
      RES=''
    fi
  fi
  while :; do
    if [ -z "$RES" ]; then
      [ "$attempts" -ge 3 ] && finish not_done "$SID: $OP failed three times"
      has_time 0.3 || finish not_done "$SID: no time left to send $OP"
      attempts=$((attempts + 1))
      tool "$OP" "$(jq -c --arg k "$KEY" --argjson w "$(waitarg 2)" '. + {idempotency_key: $k, wait_s: $w}' <<<"$P")"
    fi
    CAT=$(jq -r .category <<<"$RES")
    log "$SID: $OP -> $CAT"
    case "$CAT" in
      success)
        state=$(jq -c --arg s "$SID" --argjson r "$RES" '.done[$s] = ($r.data // {}) | del(.pending[$s])' <<<"$state"); save
        break ;;
      approval_pending)
        TOKEN=$(jq -r .resume_token <<<"$RES")
        state=$(jq -c --arg s "$SID" --arg t "$TOKEN" '.pending[$s] = $t' <<<"$state"); save
        if ! has_time 0.5; then
          finish waiting "$SID: $OP needs approval from $(jq -r .owner <<<"$RES") before $(jq -r .deadline <<<"$RES") (request $(jq -r '.request_id // "?"' <<<"$RES"))"
        fi
        tool vault_resume "$(jq -cn --arg t "$TOKEN" --argjson w "$(waitarg 1)" '{resume_token: $t, wait_s: $w}')"
        if [ "$(jq -r .category <<<"$RES")" = approval_pending ] && ! has_time 0.5; then
          finish waiting "$SID: $OP needs approval from $(jq -r .owner <<<"$RES") before $(jq -r .deadline <<<"$RES") (request $(jq -r '.request_id // "?"' <<<"$RES"))"
        fi
        continue ;;
      local_failure|confirmed_failure) RES=''; continue ;;
      rate_limited)
        d=$(jq -r '.retry_after_s // 1' <<<"$RES")
        has_time "$(awk -v d="$d" 'BEGIN { print d + 0.5 }')" || finish not_done "$SID: rate limited, no time to wait ${d}s"
        sleep "$d"; RES=''; continue ;;
      vault_locked)
        finish not_done "$SID: the vault is locked; nothing was sent" ;;
      outcome_unknown)
        CID=$(jq -r .correlation_id <<<"$RES")
        said=unknown
        for pause in 0 0.1 0.2 0.4; do
          sleep "$pause"
          has_time 0.2 || break
          tool vault_lookup "$(jq -cn --arg c "$CID" --arg o "$OP" '{correlation_id: $c, operation: $o}')"
          said=$(jq -r '.reconciled // "unknown"' <<<"$RES")
          log "$SID: lookup $CID -> $said"
          [ "$said" = unknown ] || break
        done
        case "$said" in
          found)
            state=$(jq -c --arg s "$SID" --argjson r "$RES" '.done[$s] = ($r.data.created[0] // {}) | del(.pending[$s])' <<<"$state"); save
            break ;;
          not_found) RES=''; continue ;;
          *) finish not_done "$SID: outcome unknown ($CID); a person must inspect it" ;;
        esac ;;
      *)
        finish not_done "$SID: $OP answered $CAT (retry $(jq -r '.retry // "?"' <<<"$RES")): $(jq -r '.message // ""' <<<"$RES")" ;;
    esac
  done
done
finish done "all $NSTEPS steps succeeded"
