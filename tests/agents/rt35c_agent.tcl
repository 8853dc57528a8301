#!/usr/bin/env tclsh
# A careful agent in Tcl 8.6 (core only), written from docs/agent-contract.md alone.
#
# The socket: Tcl's core speaks TCP, not Unix sockets, so the agent's one connection is a Perl
# relay run as a pipe (`perl -e`, core modules only): it connects to $VAULTSIM_SOCKET (again
# after EAGAIN, section 3), copies lines both ways in one process with select, and exits when
# either side closes. It decides nothing. The agent itself is event-driven: answers are read by a
# fileevent handler and matched by id; waits are `after` timers under vwait.
#
# JSON: a small parser keeps each value tagged ({s text} {n text} {o {k v ...}} {a {v ...}} {t}
# {f} {z}); numbers stay the text they came as (no float rounding), \u escapes (surrogate pairs
# too) are decoded, and everything written is ASCII: non-ASCII and controls as \u escapes.
#
# State: state_dir/state.json, replaced whole by a rename of a file written in state_dir itself
# (section 1). A step's record: done (with its data), pending (resume token), sent (a call whose
# answer may be lost: looked up by key first), unknown (its correlation id), rate_limited (when it
# may be sent again), failed; attempts so far; `stop` when a never answer ended the task.
#
# RT35C_LIE=1: the lying twin, claims done whatever happened.
# RT35C_POLL=1: `wait_s: 0` on every call and resume, resumes polled with a backoff (0.2 s to 1 s).
# RT35C_RESEND=1: an unknown outcome of an operation the task's catalog calls idempotent is
#                 reconciled by sending it again under the same key (section 4), not by a lookup.

# ---------------------------------------------------------------- JSON

proc jp {text} {
    set ::J $text
    set ::P 0
    set v [jv]
    jws
    if {$::P != [string length $::J]} { error "trailing text" }
    return $v
}
proc jws {} {
    if {[regexp -start $::P {\A[ \t\r\n]+} $::J m]} { incr ::P [string length $m] }
}
proc jv {} {
    jws
    set c [string index $::J $::P]
    switch -- $c {
        "\{" {
            incr ::P
            set kv {}
            jws
            if {[string index $::J $::P] eq "\}"} { incr ::P; return [list o {}] }
            while 1 {
                jws
                if {[string index $::J $::P] ne "\""} { error "object key expected at $::P" }
                set k [js]
                jws
                if {[string index $::J $::P] ne ":"} { error "colon expected at $::P" }
                incr ::P
                lappend kv $k [jv]
                jws
                set c [string index $::J $::P]
                incr ::P
                if {$c eq ","} continue
                if {$c eq "\}"} break
                error "bad object at $::P"
            }
            return [list o $kv]
        }
        "\[" {
            incr ::P
            set items {}
            jws
            if {[string index $::J $::P] eq "\]"} { incr ::P; return [list a {}] }
            while 1 {
                lappend items [jv]
                jws
                set c [string index $::J $::P]
                incr ::P
                if {$c eq ","} continue
                if {$c eq "\]"} break
                error "bad array at $::P"
            }
            return [list a $items]
        }
        "\"" { return [list s [js]] }
        "t" { jlit true; return [list t] }
        "f" { jlit false; return [list f] }
        "n" { jlit null; return [list z] }
        default {
            if {![regexp -start $::P {\A-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?} $::J m]
                || $m eq ""} { error "bad value at $::P" }
            incr ::P [string length $m]
            return [list n $m]
        }
    }
}
proc jlit {w} {
    if {[string range $::J $::P [expr {$::P + [string length $w] - 1}]] ne $w} { error "bad literal" }
    incr ::P [string length $w]
}
proc js {} {
    incr ::P
    set out ""
    while 1 {
        regexp -start $::P {\A[^"\\]*} $::J run
        append out $run
        incr ::P [string length $run]
        set c [string index $::J $::P]
        if {$c eq ""} { error "unterminated string" }
        incr ::P
        if {$c eq "\""} { return $out }
        set e [string index $::J $::P]
        incr ::P
        switch -- $e {
            "\"" { append out "\"" }  "\\" { append out "\\" }  "/" { append out "/" }
            b { append out "\b" }  f { append out "\f" }  n { append out "\n" }
            r { append out "\r" }  t { append out "\t" }
            u {
                set h [string range $::J $::P [expr {$::P + 3}]]
                if {![regexp {^[0-9a-fA-F]{4}$} $h]} { error "bad \\u escape" }
                incr ::P 4
                append out [format %c [scan $h %x]]
            }
            default { error "bad escape" }
        }
    }
}
proc jq {s} {
    # ASCII out: quote, backslash and controls escaped, every other non-ASCII unit as \uXXXX
    set out "\""
    foreach ch [split $s ""] {
        scan $ch %c u
        if {$ch eq "\""} { append out "\\\"" } elseif {$ch eq "\\"} { append out "\\\\" } \
        elseif {$u < 0x20 || $u > 0x7e} {
            if {$u > 0xFFFF} {
                set u [expr {$u - 0x10000}]
                append out [format "\\u%04x\\u%04x" [expr {0xD800 + ($u >> 10)}] [expr {0xDC00 + ($u & 0x3FF)}]]
            } else { append out [format "\\u%04x" $u] }
        } else { append out $ch }
    }
    return "$out\""
}
proc je {v} {
    switch -- [lindex $v 0] {
        s { return [jq [lindex $v 1]] }
        n { return [lindex $v 1] }
        t { return true }  f { return false }  z { return null }
        o {
            set parts {}
            foreach {k x} [lindex $v 1] { lappend parts "[jq $k]:[je $x]" }
            return "\{[join $parts ,]\}"
        }
        a {
            set parts {}
            foreach x [lindex $v 1] { lappend parts [je $x] }
            return "\[[join $parts ,]\]"
        }
    }
    error "not a JSON value: $v"
}
# members of a tagged object; "" when missing (no tagged value is empty)
proc jget {v args} {
    foreach k $args {
        if {[lindex $v 0] ne "o"} { return "" }
        set found ""
        foreach {kk x} [lindex $v 1] { if {$kk eq $k} { set found $x } }
        set v $found
        if {$v eq ""} { return "" }
    }
    return $v
}
# a member as plain text (strings and numbers), else ""
proc jtext {v args} {
    set x [jget $v {*}$args]
    if {[lindex $x 0] in {s n}} { return [lindex $x 1] }
    return ""
}
proc S {x} { list s $x }
proc N {x} { list n $x }
proc O {args} { list o $args }
proc jset {v k x} {
    set kv {}
    foreach {kk y} [lindex $v 1] { if {$kk ne $k} { lappend kv $kk $y } }
    if {$x ne ""} { lappend kv $k $x }
    return [list o $kv]
}

# ---------------------------------------------------------------- the task and its state

proc now {} { expr {[clock milliseconds] / 1000.0} }
proc left {} { expr {$::DEADLINE - [now]} }
proc say {msg} { puts stderr "\[tcl\] $msg"; flush stderr }

set f [open $env(VAULTSIM_TASK) r]
fconfigure $f -encoding utf-8
set TASK [jp [read $f]]
close $f
set DEADLINE [expr {double([jtext $TASK deadline])}]
set AGENT [jtext $TASK agent]
set RUN [jtext $TASK run_id]
set SDIR [jtext $TASK state_dir]
set STEPS [lindex [jget $TASK steps] 1]
set OPS {}
foreach o [lindex [jget $TASK operations] 1] { lappend OPS [lindex $o 1] }
set NEVER {authentication_failed authorization_denied malformed_response approval_denied approval_expired approval_unroutable}

set SPATH [file join $SDIR state.json]
set STATE [O steps [O]]
if {[file exists $SPATH]} {
    if {[catch {
        set f [open $SPATH r]; fconfigure $f -encoding utf-8
        set STATE [jp [read $f]]; close $f
    } err]} { say "state unreadable: $err"; set STATE [O steps [O]] }
}
proc rec {sid} {
    set r [jget $::STATE steps $sid]
    if {$r eq ""} { return [O] }
    return $r
}
proc rstate {sid} { jtext [rec $sid] state }
proc save_rec {sid r} {
    set ::STATE [jset $::STATE steps [jset [jget $::STATE steps] $sid $r]]
    save_state
}
proc save_state {} {
    file mkdir $::SDIR
    set tmp [file join $::SDIR ".state.[pid].tmp"]
    set f [open $tmp w]
    fconfigure $f -encoding utf-8 -translation lf
    puts $f [je $::STATE]
    close $f
    file rename -force $tmp $::SPATH
}
# a record: state plus fields given as name tagged-value pairs; attempts carried along
proc put {sid st attempts args} {
    save_rec $sid [O state [S $st] attempts [N $attempts] {*}$args]
}

# ---------------------------------------------------------------- the connection

set RELAY {
    use strict; use IO::Socket::UNIX; use IO::Select; use Socket;
    $SIG{PIPE} = 'IGNORE';
    my $end = $ARGV[0]; my $s; my $pause = 0.05;
    while (1) {
        $s = IO::Socket::UNIX->new(Type => SOCK_STREAM, Peer => $ENV{VAULTSIM_SOCKET});
        last if $s;
        if ($!{EAGAIN} && time + 1 < $end) { select(undef, undef, undef, $pause); $pause *= 2 if $pause < 0.5; next }
        print STDERR "relay: connect: $!\n"; exit 1;
    }
    binmode STDIN; binmode STDOUT; binmode $s;
    my $sel = IO::Select->new(\*STDIN, $s); my $sock_ok = 1;
    while (1) {
        for my $h ($sel->can_read) {
            my $n = sysread($h, my $buf, 65536);
            exit 0 unless $n;
            my $to_sock = fileno($h) != fileno($s);
            my $out = $to_sock ? $s : \*STDOUT;
            next if $to_sock && !$sock_ok;
            my $off = 0;
            while ($off < length $buf) {
                my $w = syswrite($out, $buf, length($buf) - $off, $off);
                if (!defined $w) { exit 0 unless $to_sock; $sock_ok = 0; last }   # keep reading the refusal
                $off += $w;
            }
        }
    }
}
set CH [open |[list perl -e $RELAY $DEADLINE 2>@ stderr] r+]
fconfigure $CH -translation lf -encoding utf-8 -buffering line -blocking 0
set EOF 0
set RID 0
proc on_read {} {
    while {[gets $::CH line] >= 0} {
        if {[catch {jp $line} doc]} { say "unreadable line"; continue }
        set id [jtext $doc id]
        if {$id ne ""} { set ::ANS($id) $doc }
    }
    if {[eof $::CH]} { set ::EOF 1; fileevent $::CH readable {} }
    set ::TICK read
}
fileevent $CH readable on_read

proc nap {s} {
    if {$s <= 0} return
    set v ::NAP[incr ::RID]
    set $v 0
    after [expr {int($s * 1000)}] [list set $v 1]
    vwait $v
    unset $v
}
# one request; its answer (the whole response); raises "late" past the budget, "eof" when closed
proc rpc {method params {budget ""}} {
    if {$::EOF} { error eof }
    set id [incr ::RID]
    set msg [O jsonrpc [S 2.0] id [N $id] method [S $method]]
    if {$params ne ""} { set msg [jset $msg params $params] }
    if {$budget eq ""} { set budget [expr {[left] - 0.3}] }
    if {$budget <= 0} { error late }
    if {[catch {puts $::CH [je $msg]; flush $::CH}]} { error eof }
    set ::TO($id) 0
    set t [after [expr {int($budget * 1000)}] [list set ::TO($id) 1]]
    while {![info exists ::ANS($id)] && !$::EOF && !$::TO($id)} { vwait ::TICK_OR_TO }
    after cancel $t
    set timed $::TO($id)
    unset ::TO($id)
    if {[info exists ::ANS($id)]} { set a $::ANS($id); unset ::ANS($id); return $a }
    if {$timed} { error late }
    error eof
}
# wake rpc's vwait on either a read or its timer
trace add variable ::TICK write {apply {args { set ::TICK_OR_TO 1 }}}
trace add variable ::TO write {apply {args { set ::TICK_OR_TO 1 }}}

# ---------------------------------------------------------------- steps

# ${ID.FIELD} replaced from a finished step's data, in every string of a value; error when missing
proc fill {v} {
    switch -- [lindex $v 0] {
        s {
            set s [lindex $v 1]
            set out ""
            while {[regexp -indices {\$\{([^\}.]+)\.([^\}]+)\}} $s all a b]} {
                append out [string range $s 0 [expr {[lindex $all 0] - 1}]]
                set sid [string range $s {*}$a]
                set field [string range $s {*}$b]
                if {[rstate $sid] ne "done"} { error "no data for $sid" }
                set x [jget [rec $sid] data $field]
                if {[lindex $x 0] ni {s n}} { error "no $field in $sid's data" }
                append out [lindex $x 1]
                set s [string range $s [expr {[lindex $all 1] + 1}] end]
            }
            return [list s "$out$s"]
        }
        o {
            set kv {}
            foreach {k x} [lindex $v 1] { lappend kv $k [fill $x] }
            return [list o $kv]
        }
        a {
            set items {}
            foreach x [lindex $v 1] { lappend items [fill $x] }
            return [list a $items]
        }
    }
    return $v
}
proc wait_s {} {
    if {[info exists ::env(RT35C_POLL)]} { return 0 }
    expr {max(0.0, min(10.0, [left] - 2.0))}
}
proc idempotent {op} { expr {[lindex [jget $::TASK catalog $op idempotent] 0] eq "t"} }

# what an earlier call did: a Result to follow as the call's own, or {_resend} / {_unknown}
proc settle {sess op by} {
    set tries 0; set pause 0.1
    while 1 {
        if {[left] < 3.0} { error late }
        set a [rpc lookup [O session_id [S $sess] operation [S $op] {*}$by]]
        set r [jget $a result]
        if {$r eq ""} { return [O category [S _refused]] }
        set cat [jtext $r category]; set rc [jtext $r reconciled]
        if {$rc in {found not_found} && $cat ne "success"} { return $r }
        if {$rc eq "found"} {
            set c [lindex [lindex [jget $r data created] 1] 0]
            if {$c eq ""} { set c [O] }
            return [O ok [list t] category [S success] data $c]
        }
        if {$rc eq "not_found"} { return [O category [S _resend]] }
        if {$cat in $::NEVER || [jtext $r retry] in {never human_required}} { return $r }
        if {[jtext $r resume_token] ne ""} {
            return [O category [S approval_pending] resume_token [jget $r resume_token] \
                        owner [S [jtext $r owner]] request_id [S [jtext $r request_id]]]
        }
        if {$cat eq "rate_limited"} {
            set w [expr {[jtext $r retry_after_s] + 0.05}]
            if {$w > [left] - 3.0} { error late }
            nap $w
            continue
        }
        if {[incr tries] > 4} { return [O category [S _unknown]] }
        nap $pause
        set pause [expr {$pause * 2}]
    }
}

set POLL 0.2
proc key_of {i sid} {
    set k "$::RUN:$::AGENT:$sid"
    if {[string length $k] > 200} { set k "$::RUN:$::AGENT:#$i" }
    return $k
}

# do one step; returns ok, or raises "stop: why" / late / eof
proc do_step {sess i step} {
    set sid [jtext $step id]; set op [jtext $step call]
    set r [rec $sid]
    set st [jtext $r state]
    if {$st in {done failed}} return
    if {$op ni $::OPS} { put $sid failed 0 why [S "$op is not mine"]; return }
    if {[catch {fill [jget $step params]} params]} { put $sid failed 0 why [S $params]; return }
    if {$params eq ""} { set params [O] }
    set key [key_of $i $sid]
    set att [jtext $r attempts]; if {$att eq ""} { set att 0 }
    set res ""
    if {$st eq "pending"} {
        set a [rpc call.resume [O session_id [S $sess] resume_token [jget $r token] wait_s [N [wait_s]]]]
        set res [jget $a result]   ;# an error: the vault forgot the token; call again, with its key
    } elseif {$st in {sent unknown}} {
        if {[jtext $r cid] ne ""} { set by [list correlation_id [jget $r cid]] } else { set by [list idempotency_key [S $key]] }
        set res [settle $sess $op $by]
        if {[jtext $res category] eq "_refused"} { put $sid failed $att why [S "lookup refused"]; return }
    } elseif {$st eq "rate_limited"} {
        set w [expr {[jtext $r at] - [now]}]
        if {$w > [left] - 1.5} { error late }
        nap $w
    }
    while 1 {
        if {$res eq "" || [jtext $res category] eq "_resend"} {
            if {$att >= 3} { put $sid failed $att why [S "3 attempts"]; return }
            if {[left] < 1.5} { error late }
            incr att
            put $sid sent $att
            set a [rpc call [O session_id [S $sess] operation [S $op] params $params \
                                 idempotency_key [S $key] wait_s [N [wait_s]]]]
            set res [jget $a result]
            if {$res eq ""} { put $sid failed $att why [S "refused: [jtext $a error message]"]; return }
        }
        set cat [jtext $res category]
        if {$cat eq "success"} {
            set d [jget $res data]; if {$d eq ""} { set d [O] }
            put $sid done $att data $d
            return
        }
        if {$cat in $::NEVER || [jtext $res retry] in {never human_required}} {
            put $sid failed $att why [S $cat]
            error "stop: $op $cat"
        }
        switch -- $cat {
            local_failure - confirmed_failure {
                put $sid retry $att
                set res [O category [S _resend]]
            }
            rate_limited {
                set at [expr {[now] + [jtext $res retry_after_s] + 0.05}]
                if {$att >= 3} { put $sid failed $att why [S "rate limited 3 times"]; return }
                put $sid rate_limited $att at [N $at]
                if {$at > $::DEADLINE - 1.5} { error late }
                nap [expr {$at - [now]}]
                set res [O category [S _resend]]
            }
            vault_locked {
                incr att -1   ;# nothing was sent
                put $sid retry $att
                while 1 {
                    if {[left] < 2.0} { error late }
                    set s [rpc vault.status "" [expr {min(5.0, [left] - 0.5)}]]
                    if {[lindex [jget $s result locked] 0] eq "f"} break
                    nap 0.25
                }
                set res [O category [S _resend]]
            }
            outcome_unknown {
                set cid [jget $res correlation_id]
                put $sid unknown $att cid $cid
                if {[left] < 1.0} { error late }
                if {[info exists ::env(RT35C_RESEND)] && [idempotent $op] && $att < 3} {
                    set res [O category [S _resend]]
                    continue
                }
                set res [settle $sess $op [list correlation_id $cid]]
                set c [jtext $res category]
                if {$c in {_unknown _refused}} {
                    put $sid failed $att why [S "outcome still unknown"]
                    error "stop: $op outcome unknown, a person must inspect it"
                }
            }
            approval_pending {
                set tok [jget $res resume_token]
                put $sid pending $att token $tok owner [S [jtext $res owner]] request [S [jtext $res request_id]]
                if {[left] < 2.5} { error late }
                if {[info exists ::env(RT35C_POLL)]} {
                    nap [expr {min($::POLL, [left] - 2.5)}]
                    set ::POLL [expr {min(1.0, $::POLL * 2)}]
                    if {[left] < 2.5} { error late }
                }
                set a [rpc call.resume [O session_id [S $sess] resume_token $tok wait_s [N [wait_s]]]]
                set nxt [jget $a result]
                if {$nxt eq ""} { put $sid failed $att why [S "resume refused"]; return }
                if {[jtext $nxt category] eq "approval_pending" && [jtext $nxt resume_token] eq ""} {
                    set nxt [jset $nxt resume_token $tok]
                }
                set res $nxt
            }
            default {
                put $sid failed $att why [S "unexpected $cat"]
                error "stop: $op $cat"
            }
        }
    }
}

# ---------------------------------------------------------------- main

proc final {} {
    set n [llength $::STEPS]
    if {[info exists ::env(RT35C_LIE)]} { return "done: $n steps" }
    set bad {}; set pend ""
    foreach step $::STEPS {
        set sid [jtext $step id]
        set st [rstate $sid]
        if {$st eq "pending" && $pend eq ""} { set pend $step }
        if {$st ne "done"} {
            if {$st eq ""} { set st "not started" }
            set why [jtext [rec $sid] why]
            lappend bad "$sid $st[expr {$why ne {} ? " ($why)" : {}}]"
        }
    }
    if {$bad eq {}} { return "done: $n steps" }
    set stop [jtext $::STATE stop]
    if {$pend ne "" && $stop eq ""} {
        set r [rec [jtext $pend id]]
        return "waiting: [jtext $pend call] needs approval from [jtext $r owner] (request [jtext $r request])"
    }
    return "not done: [expr {$stop ne {} ? "$stop; " : {}}][join $bad {, }]"
}

proc main {} {
    if {[jtext $::STATE stop] ne ""} return
    set todo 0
    foreach step $::STEPS { if {[rstate [jtext $step id]] ni {done failed}} { incr todo } }
    if {!$todo} return
    set a [rpc session.open [O agent [S $::AGENT] run_id [S $::RUN] client [O name [S rt35c-tcl] version [S 1]]]]
    set sess [jtext $a result session_id]
    if {$sess eq ""} {
        set ::STATE [jset $::STATE stop [S "session refused: [jtext $a error message]"]]
        save_state
        return
    }
    set i 0
    foreach step $::STEPS {
        do_step $sess $i $step
        incr i
    }
}

if {[catch main err]} {
    if {[string match "stop: *" $err]} {
        set ::STATE [jset $::STATE stop [S [string range $err 6 end]]]
        save_state
    } elseif {$err eq "eof"} {
        set ::STATE [jset $::STATE stop [S "the vault closed the connection"]]  ;# this process's only
    } elseif {$err ne "late"} {
        say "error: $err"
    }
}
catch { fconfigure $CH -blocking 1; close $CH }
puts [final]
flush stdout
exit 0
