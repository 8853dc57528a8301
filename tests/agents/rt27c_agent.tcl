#!/usr/bin/env tclsh
# A careful agent in Tcl 8.6, written from docs/agent-contract.md alone (Tcl core only).
#
# The socket: Tcl's core has TCP sockets but no Unix-socket client, and this machine has no
# tcllib or ceptcl. The agent opens its one connection through a tiny relay run as a pipe
# (`open |python3 -c ...`): it connects to $VAULTSIM_SOCKET, copies each line the agent writes to
# the socket and each line the vault answers back, and exits when the agent closes the pipe (the
# connection, and so the session, ends with it). The relay holds no state and decides nothing; it
# is the process that writes on the socket, so it is the one the vault binds the session to, and
# every message of the session goes through it (§3: never hand a session to another process).
#
# JSON: no tcllib here either, so a small parser below keeps every value tagged with its type
# ({s ...} string, {n ...} number, {o ...} object, {a ...} array, {t} {f} {z}), and an emitter
# writes it back as it came: a step's params are sent with their own types.
#
# State: a Tcl dict in state_dir (written beside itself and renamed over the old one: a rename
# from /tmp fails in the jail, §1). Tcl has no fsync; the rename keeps a reader from ever seeing
# half a file. A restart finds finished steps (with their data) and pending resume tokens there.
#
# Knobs: RT27T_WAIT=poll  `wait_s: 0` and call.resume polled with a backoff; else blocking waits.
#        RT27T_FINAL=kv   final message `Status: WORD` (§7's label) instead of `WORD: why`.
#        RT27T_PRECHECK=1 `vault.status` read before the first call; while it says locked nothing is
#                         sent (§4 vault_locked: "as good"), until it unlocks or the deadline nears.

set MARGIN 1.0

# ---------------------------------------------------------------- JSON

proc jp_ws {} {
    upvar #0 JP_T t JP_I i
    while {$i < [string length $t] && [string is space [string index $t $i]]} { incr i }
}

proc jp_value {} {
    upvar #0 JP_T t JP_I i
    jp_ws
    set c [string index $t $i]
    switch -- $c {
        "\{" {
            incr i
            set out {}
            jp_ws
            if {[string index $t $i] eq "\}"} { incr i; return [list o $out] }
            while 1 {
                jp_ws
                set k [lindex [jp_value] 1]
                jp_ws
                if {[string index $t $i] ne ":"} { error "json: expected : at $i" }
                incr i
                dict set out $k [jp_value]
                jp_ws
                set c [string index $t $i]
                incr i
                if {$c eq "\}"} { return [list o $out] }
                if {$c ne ","} { error "json: expected , or \} at $i" }
            }
        }
        "\[" {
            incr i
            set out {}
            jp_ws
            if {[string index $t $i] eq "\]"} { incr i; return [list a $out] }
            while 1 {
                lappend out [jp_value]
                jp_ws
                set c [string index $t $i]
                incr i
                if {$c eq "\]"} { return [list a $out] }
                if {$c ne ","} { error "json: expected , or \] at $i" }
            }
        }
        "\"" {
            incr i
            set s ""
            while 1 {
                set j [string first "\"" $t $i]
                set b [string first "\\" $t $i]
                if {$j < 0} { error "json: open string" }
                if {$b >= 0 && $b < $j} {
                    append s [string range $t $i [expr {$b - 1}]]
                    set e [string index $t [expr {$b + 1}]]
                    set i [expr {$b + 2}]
                    switch -- $e {
                        n { append s "\n" } t { append s "\t" } r { append s "\r" }
                        b { append s "\b" } f { append s "\f" }
                        u { append s [format %c [scan [string range $t $i [expr {$i + 3}]] %x]]; incr i 4 }
                        default { append s $e }
                    }
                } else {
                    append s [string range $t $i [expr {$j - 1}]]
                    set i [expr {$j + 1}]
                    return [list s $s]
                }
            }
        }
        t { incr i 4; return {t} }
        f { incr i 5; return {f} }
        n { incr i 4; return {z} }
        default {
            if {![regexp -start $i -- {-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?} $t num]} {
                error "json: bad value at $i"
            }
            incr i [string length $num]
            return [list n $num]
        }
    }
}

proc json_parse {text} {
    set ::JP_T $text
    set ::JP_I 0
    return [jp_value]
}

proc json_str {s} {
    set map [list "\\" "\\\\" "\"" "\\\"" "\n" "\\n" "\r" "\\r" "\t" "\\t" "\b" "\\b" "\f" "\\f"]
    set s [string map $map $s]
    if {[regexp {[\x00-\x1f\x7f]} $s]} {
        # the other control characters, as \u00XX
        set out ""
        foreach ch [split $s ""] {
            scan $ch %c c
            if {$c < 32 || $c == 127} { append out [format "\\u%04x" $c] } else { append out $ch }
        }
        set s $out
    }
    return "\"$s\""
}

proc json_emit {v} {
    switch -- [lindex $v 0] {
        o {
            set parts {}
            dict for {k x} [lindex $v 1] { lappend parts "[json_str $k]:[json_emit $x]" }
            return "\{[join $parts ,]\}"
        }
        a {
            set parts {}
            foreach x [lindex $v 1] { lappend parts [json_emit $x] }
            return "\[[join $parts ,]\]"
        }
        s { return [json_str [lindex $v 1]] }
        n { return [lindex $v 1] }
        t { return true } f { return false } z { return null }
    }
}

# the plain value at a path of object keys, or the default
proc jget {v args} {
    set default ""
    foreach k $args {
        if {[lindex $v 0] ne "o" || ![dict exists [lindex $v 1] $k]} { return $default }
        set v [dict get [lindex $v 1] $k]
    }
    switch -- [lindex $v 0] {
        s - n { return [lindex $v 1] }
        t { return true } f { return false } z { return "" }
        default { return $v }
    }
}

proc jhas {v k} { expr {[lindex $v 0] eq "o" && [dict exists [lindex $v 1] $k]} }

# ---------------------------------------------------------------- log, clock, task

proc log {msg} {
    puts stderr "[clock format [clock seconds] -format %H:%M:%S -gmt 1] rt27c-tcl: $msg"
    flush stderr
}

proc now {} { expr {[clock milliseconds] / 1000.0} }
proc left {} { expr {$::DEADLINE - [now]} }

set f [open $env(VAULTSIM_TASK) r]
fconfigure $f -encoding utf-8
set TASK [json_parse [read $f]]
close $f
set DEADLINE [jget $TASK deadline]
set AGENT [jget $TASK agent]
set RUN_ID [jget $TASK run_id]
set STATE_FILE [file join [jget $TASK state_dir] rt27c-tcl.state]
set ALLOWED {}
foreach op [lindex [jget $TASK operations] 1] { lappend ALLOWED [lindex $op 1] }
set POLL [expr {[info exists env(RT27T_WAIT)] && $env(RT27T_WAIT) eq "poll"}]

# ---------------------------------------------------------------- state (a Tcl dict in state_dir)

proc load_state {} {
    if {![file exists $::STATE_FILE]} { return [dict create steps {}] }
    set f [open $::STATE_FILE r]
    fconfigure $f -encoding utf-8
    set s [read $f]
    close $f
    if {[catch {dict size $s}]} { return [dict create steps {}] }
    return $s
}

proc save_state {} {
    set tmp $::STATE_FILE.tmp
    set f [open $tmp w]
    fconfigure $f -encoding utf-8
    puts -nonewline $f $::STATE
    close $f
    file rename -force $tmp $::STATE_FILE
}

proc step_get {id key {default ""}} {
    if {[dict exists $::STATE steps $id $key]} { return [dict get $::STATE steps $id $key] }
    return $default
}

proc step_put {id args} {
    dict set ::STATE steps $id [dict create {*}$args]
    save_state
}

# ---------------------------------------------------------------- the connection (a relay pipe)

set RELAY {
import os, socket, sys, threading
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["VAULTSIM_SOCKET"])
def down():
    for line in s.makefile("rb"):
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
    os._exit(0)
threading.Thread(target=down, daemon=True).start()
for line in sys.stdin.buffer:
    s.sendall(line)
os._exit(0)
}

proc connect {} {
    set ::CONN [open |[list python3 -u -c $::RELAY 2>@stderr] r+]
    fconfigure $::CONN -blocking 0 -buffering line -translation lf -encoding utf-8
    set ::NEXT_ID 0
}

proc readable {} { set ::READY 1 }
proc timed_out {} { set ::READY 0 }

# one request, its answer's result (tagged), or {o {category {s rpc_error} ...}} on an error
proc rpc {method params} {
    if {[left] <= 0.2} { return [list o [dict create category {s deadline}]] }
    incr ::NEXT_ID
    set id $::NEXT_ID
    puts $::CONN "\{\"jsonrpc\":\"2.0\",\"id\":$id,\"method\":[json_str $method],\"params\":$params\}"
    flush $::CONN
    while 1 {
        set n [gets $::CONN line]
        if {$n > 0} {
            if {[catch {json_parse $line} msg]} { continue }
            if {[jget $msg id] ne $id} { continue }  ;# not ours: ignore (§3)
            if {[jhas $msg error]} {
                return [list o [dict create category {s rpc_error} message [list s [jget $msg error message]]]]
            }
            return [jget $msg result]
        }
        if {[eof $::CONN]} { return [list o [dict create category {s rpc_error} message {s "connection closed"}]] }
        if {$n == 0} { continue }
        # nothing yet: wait for the pipe, or for the deadline
        set ms [expr {int(([left] - 0.1) * 1000)}]
        if {$ms <= 0} { return [list o [dict create category {s deadline}]] }
        set ::READY ""
        fileevent $::CONN readable readable
        set timer [after $ms timed_out]
        vwait ::READY
        after cancel $timer
        fileevent $::CONN readable {}
        if {$::READY == 0} { return [list o [dict create category {s deadline}]] }
    }
}

proc obj {args} {
    # an object from key / JSON-text pairs
    set parts {}
    foreach {k v} $args { lappend parts "[json_str $k]:$v" }
    return "\{[join $parts ,]\}"
}

proc wait_s {} {
    if {$::POLL} { return 0 }
    set w [expr {[left] - $::MARGIN - 0.3}]
    if {$w > 10} { set w 10 }
    if {$w < 0} { set w 0 }
    return [format %.2f $w]
}

proc pause {s} {
    if {$s <= 0} return
    after [expr {int($s * 1000)}]
}

# ---------------------------------------------------------------- one step, to a settled answer

proc collect {token first} {
    set res $first
    set p 0.1
    while {[jget $res category] eq "approval_pending" && [left] > $::MARGIN + 0.3} {
        if {$::POLL} {
            pause [expr {min($p, [left] - $::MARGIN - 0.3)}]
            set p [expr {min(1.0, $p * 2)}]
            if {[left] <= $::MARGIN + 0.3} break
        }
        set res [rpc call.resume [obj session_id [json_str $::SID] resume_token [json_str $token] wait_s [wait_s]]]
        log "resume: [jget $res category]"
    }
    return $res
}

# lookup (§6), again shortly while `unknown`; an answer to act on, its category our reading
proc reconcile {op by value} {
    set last {o {}}
    foreach p {0 0.1 0.2 0.4} {
        pause $p
        if {[left] < $::MARGIN + 0.5} break
        set last [rpc lookup [obj session_id [json_str $::SID] operation [json_str $op] $by [json_str $value]]]
        set cat [jget $last category]
        log "lookup $op: $cat [jget $last reconciled]"
        if {$cat ne "success" && $cat ne ""} { return $last }  ;# the call's own answer again (§6)
        switch -- [jget $last reconciled] {
            found {
                set created [jget $last data created]
                set first {o {}}
                if {[lindex $created 0] eq "a" && [llength [lindex $created 1]]} { set first [lindex $created 1 0] }
                return [list o [dict create category {s success} data $first]]
            }
            not_found { return [list o [dict create category {s local_failure} message {s "lookup: not found"}]] }
        }
        set token [jget $last resume_token]
        if {$token ne ""} {
            return [collect $token [list o [dict create category {s approval_pending} resume_token [list s $token] \
                owner [list s [jget $last owner]] request_id [list s [jget $last request_id]] \
                deadline [list s [jget $last deadline]]]]]
        }
    }
    return [list o [dict create category {s unresolved} message {s "the lookup stayed unknown"}]]
}

proc substitute {v} {
    switch -- [lindex $v 0] {
        s {
            set s [lindex $v 1]
            set out ""
            while {[regexp -indices {\$\{([^.\}]+)\.([^\}]+)\}} $s all a b]} {
                set id [string range $s {*}$a]
                set field [string range $s {*}$b]
                if {[step_get $id state] ne "done"} { error "no data of $id" }
                set data [json_parse [step_get $id data "{}"]]
                if {![jhas $data $field]} { error "no $field in $id's data" }
                append out [string range $s 0 [expr {[lindex $all 0] - 1}]] [jget $data $field]
                set s [string range $s [expr {[lindex $all 1] + 1}] end]
            }
            return [list s "$out$s"]
        }
        o {
            set out {}
            dict for {k x} [lindex $v 1] { dict set out $k [substitute $x] }
            return [list o $out]
        }
        a {
            set out {}
            foreach x [lindex $v 1] { lappend out [substitute $x] }
            return [list a $out]
        }
        default { return $v }
    }
}

proc run_step {step} {
    set id [jget $step id]
    set op [jget $step call]
    set key "$::RUN_ID:$::AGENT:$id"
    set params [json_emit [substitute [expr {[jhas $step params] ? [jget $step params] : {o {}}}]]]
    set mutating [expr {[jget $::TASK catalog $op mutates] ne "false"}]
    set idempotent [expr {[jget $::TASK catalog $op idempotent] eq "true"}]
    set attempts [step_get $id attempts 0]
    set res ""
    switch -- [step_get $id state] {
        pending {
            set token [step_get $id token]
            log "$id: collecting the approval a predecessor waited for"
            set res [collect $token [list o [dict create category {s approval_pending} resume_token [list s $token]]]]
            if {[jget $res category] eq "rpc_error"} { set res "" }  ;# token unknown: call again, its key (§8)
        }
        sent {
            log "$id: a predecessor sent it and kept no answer: looking it up first"
            set res [reconcile $op idempotency_key $key]
            if {[jget $res category] eq "local_failure"} { set res "" }
        }
    }
    while 1 {
        if {$res eq ""} {
            if {[left] < $::MARGIN} { return {o {category {s deadline}}} }
            if {$attempts > 0 && $mutating && !$idempotent} {
                set look [reconcile $op idempotency_key $key]  ;# §6: before any resend of such a write
                if {[jget $look category] ne "local_failure"} { set res $look; continue }
            }
            incr attempts
            step_put $id state sent attempts $attempts
            set res [rpc call [obj session_id [json_str $::SID] operation [json_str $op] params $params \
                idempotency_key [json_str $key] wait_s [wait_s]]]
            log "$id: $op -> [jget $res category]"
        }
        set cat [jget $res category]
        switch -- $cat {
            approval_pending {
                set token [jget $res resume_token]
                if {$token eq ""} { return $res }
                step_put $id state pending attempts $attempts token $token
                set res [collect $token $res]
                if {[jget $res category] eq "approval_pending"} { return $res }
            }
            outcome_unknown {
                set cid [jget $res correlation_id]
                if {$cid ne ""} {
                    set res [reconcile $op correlation_id $cid]
                } else {
                    set res [reconcile $op idempotency_key $key]
                }
                if {[jget $res category] eq "local_failure"} {
                    if {$attempts >= 3} { return $res }
                    set res ""
                }
            }
            vault_locked {
                while {[left] > $::MARGIN} {
                    set st [rpc vault.status {{}}]
                    if {[jget $st locked] eq "false"} break
                    pause [expr {min(0.25, [left] - $::MARGIN)}]
                }
                if {[left] <= $::MARGIN} { return $res }
                set res ""
            }
            local_failure - confirmed_failure - rate_limited {
                if {$attempts >= 3} { return $res }
                if {$cat eq "rate_limited"} {
                    set d [jget $res retry_after_s]
                    if {$d eq ""} { set d 1.0 }
                    if {$d > [left] - $::MARGIN - 0.2} { return $res }
                    log "$id: waiting $d s (Retry-After)"
                    pause $d
                }
                set res ""
            }
            default { return $res }
        }
    }
}

# ---------------------------------------------------------------- main

set STATE [load_state]
set STOP ""
set WAIT ""
connect
set got [rpc session.open [obj agent [json_str $AGENT] run_id [json_str $RUN_ID] \
    client [obj name [json_str rt27c-tcl] version [json_str 1]]]]
set SID [jget $got session_id]
if {$SID eq ""} { set STOP "no session: [jget $got message]" }

if {$STOP eq "" && [info exists env(RT27T_PRECHECK)] && $env(RT27T_PRECHECK) eq "1"} {
    while 1 {
        set st [rpc vault.status {{}}]
        if {[jget $st locked] eq "false"} break
        if {[left] <= $MARGIN + 0.3} { set STOP "the vault stayed locked (vault.status)"; break }
        pause [expr {min(0.5, [left] - $MARGIN - 0.3)}]
    }
    log "vault.status: locked [jget $st locked]"
}

set steps [lindex [jget $TASK steps] 1]
foreach step $steps {
    if {$STOP ne "" || $WAIT ne ""} break
    set id [jget $step id]
    set op [jget $step call]
    set state [step_get $id state]
    if {$state eq "done" || $state eq "gave_up" || $state eq "skipped"} continue
    if {$state eq "stopped"} { set STOP [step_get $id why]; break }
    if {[lsearch -exact $ALLOWED $op] < 0} {
        step_put $id state skipped why "$op is not allowed"
        continue
    }
    if {[catch {run_step $step} res]} {
        log "$id: skipped: $res"
        step_put $id state skipped why $res
        continue
    }
    set cat [jget $res category]
    switch -- $cat {
        success {
            set data [jget $res data]
            if {[lindex $data 0] ne "o"} { set data {o {}} }
            step_put $id state done data [json_emit $data]
        }
        approval_pending {
            set WAIT "$op needs approval from [jget $res owner] before [jget $res deadline] (request [jget $res request_id])"
        }
        local_failure - confirmed_failure {
            step_put $id state gave_up why "$op: $cat after 3 attempts"
        }
        default {
            step_put $id state stopped why "$op: $cat"
            set STOP "$op: $cat"
        }
    }
}

if {$SID ne "" && [left] > 0.5} { rpc session.close [obj session_id [json_str $SID]] }
# blocking again, so close waits for the relay: it is gone before this process is
catch { fconfigure $CONN -blocking 1; close $CONN }

set n 0
foreach step $steps { if {[step_get [jget $step id] state] eq "done"} { incr n } }
set total [llength $steps]
if {$WAIT ne ""} {
    set word waiting
    set why $WAIT
} elseif {$n == $total && $STOP eq ""} {
    set word done
    set why "all $total steps succeeded"
} else {
    set word "not done"
    set why "$n of $total steps done[expr {$STOP ne "" ? "; stopped: $STOP" : ""}]"
}
if {[info exists env(RT27T_FINAL)] && $env(RT27T_FINAL) eq "kv"} {
    puts "Status: $word ($why)"
} else {
    puts "$word: $why"
}
flush stdout
exit 0
