#!/usr/bin/perl
# Red team 38c: a careful Perl agent written from docs/agent-contract.md alone, core Perl only
# (IO::Socket::UNIX, JSON::PP, File::Temp, POSIX, Time::HiRes, Digest::SHA, IO::Select).
#
# The main process opens one connection and one session (section 3) and does the gated and the
# mutating steps itself, in order, each after every earlier one settled. Consecutive steps of
# `auto`, non-mutating operations that need nothing from each other are handed to forked worker
# processes, each opening its own connection and session (a session belongs to its process),
# side by side; a worker told `never` leaves a stop mark so that no other sends again.
# Keys per section 5 (RUN:AGENT:STEP), lookups per section 6, state in state_dir written to a temp
# file there and renamed over (section 1: a rename from /tmp fails in the jail), a restart skips
# what is done, resumes saved tokens and looks up what was in flight. Final line per section 7.
#
# RT38C_CRASH=OP: die (exit 3) once the first call of OP is answered, before keeping the answer
# (once per state_dir): the next process must look it up, not send it again.
# RT38C_LIE=1: the lying twin: prints done whatever happened.
use strict;
use warnings;
use IO::Socket::UNIX;
use IO::Select;
use JSON::PP;
use File::Temp ();
use POSIX ();
use Time::HiRes qw(time sleep);
use Digest::SHA qw(sha256_hex);
use Encode ();

$| = 1;
my $JSON = JSON::PP->new->utf8->canonical;
my $task = do {
    open my $fh, '<:raw', $ENV{VAULTSIM_TASK} or finish("not done: cannot read the task file: $!");
    local $/;
    $JSON->decode(scalar <$fh>);
};
my $RUN = $ENV{VAULTSIM_RUN_ID} // $task->{run_id};
my $AGENT = $task->{agent};
my $DEADLINE = $task->{deadline} + 0;
my $SDIR = $task->{state_dir};
my $STATE_FILE = "$SDIR/rt38c-state.json";
my $STOP_FILE = "$SDIR/rt38c-stop";
my $LIE = $ENV{RT38C_LIE};
my $CRASH = $ENV{RT38C_CRASH} // '';
my %NEVER = map { $_ => 1 } qw(never human_required);
my $IS_WORKER = 0;

sub left { $DEADLINE - time() }

sub finish {
    my ($line) = @_;
    $line = 'done: (lying twin) every step succeeded' if $LIE && !$IS_WORKER;
    print "$line\n";
    exit 0;
}

# ---- state (one JSON file, replaced whole) ----
my $state = { steps => {} };
if (-e $STATE_FILE) {
    if (open my $fh, '<:raw', $STATE_FILE) { local $/; my $t = <$fh>; $state = eval { $JSON->decode($t) } || $state; }
}
sub st { my ($id) = @_; $state->{steps}{$id} //= {} }
sub save {
    return if $IS_WORKER;
    my $tmp = File::Temp->new(DIR => $SDIR, TEMPLATE => '.rt38c-XXXXXX', UNLINK => 0);
    print {$tmp} $JSON->encode($state);
    $tmp->flush; $tmp->sync;
    close $tmp;
    rename($tmp->filename, $STATE_FILE) or do { unlink $tmp->filename; warn "state not saved: $!\n" };
}

# ---- the wire ----
package Wire {
    sub new {
        my ($class) = @_;
        my $sock;
        my $delay = 0.05;
        while (1) {
            $sock = IO::Socket::UNIX->new(Type => Socket::SOCK_STREAM(), Peer => $ENV{VAULTSIM_SOCKET});
            last if $sock;
            # EAGAIN: the vault's accept queue is full; back off and try again within the deadline
            return undef if main::left() < 1 || !($!{EAGAIN} || $!{ECONNREFUSED} || $!{ENOENT});
            Time::HiRes::sleep($delay); $delay *= 2 if $delay < 0.4;
        }
        binmode $sock;
        my $self = bless { s => $sock, buf => '', n => 0, sid => undef, sel => IO::Select->new($sock) }, $class;
        return $self;
    }
    # one request; its answer (the whole JSON-RPC message), or undef on a lost connection or the deadline
    sub rpc {
        my ($self, $method, $params, $until) = @_;
        my $id = ++$self->{n};
        my $p = { %{ $params // {} } };
        $p->{session_id} = $self->{sid} if defined $self->{sid} && $method ne 'session.open' && $method ne 'catalog'
            && $method ne 'vault.status';
        my $line = $JSON->encode({ jsonrpc => '2.0', id => $id, method => $method, params => $p }) . "\n";
        local $SIG{PIPE} = 'IGNORE';
        my $off = 0;
        while ($off < length $line) {
            my $w = syswrite($self->{s}, $line, length($line) - $off, $off);
            last unless defined $w;  # a refusal may be waiting to be read: read before giving up
            $off += $w;
        }
        $until //= $DEADLINE - 0.1;
        while (1) {
            while ($self->{buf} =~ s/^([^\n]*)\n//) {
                my $msg = eval { $JSON->decode($1) };
                next unless ref $msg eq 'HASH' && defined $msg->{id} && !ref $msg->{id} && $msg->{id} eq $id;
                return $msg;
            }
            my $wait = $until - Time::HiRes::time();
            return undef if $wait <= 0;
            next unless $self->{sel}->can_read($wait > 0.5 ? 0.5 : $wait);
            my $r = sysread($self->{s}, $self->{buf}, 65536, length $self->{buf});
            return undef unless $r;
        }
    }
    sub open_session {
        my ($self) = @_;
        my $a = $self->rpc('session.open', { agent => $AGENT, run_id => $RUN });
        return undef unless $a && $a->{result};
        $self->{sid} = $a->{result}{session_id};
        return $self->{sid};
    }
}

# ---- the task ----
my @steps = @{ $task->{steps} };
my %allowed = map { $_ => 1 } @{ $task->{operations} // [] };
my %done_data;   # step id -> result data
for my $s (@steps) { my $x = $state->{steps}{ $s->{id} }; $done_data{ $s->{id} } = $x->{data} if $x && $x->{done}; }

sub key_of {
    my ($step) = @_;
    my $k = "$RUN:$AGENT:$step->{id}";
    return length($k) <= 200 ? $k : "rt38c:" . sha256_hex(Encode::encode_utf8($k));
}

# which earlier step (by id) a `${ID.FIELD}` names: the longest step id the text starts with
sub refs_in {
    my ($v, $out) = @_;
    if (ref $v eq 'HASH') { refs_in($_, $out) for values %$v }
    elsif (ref $v eq 'ARRAY') { refs_in($_, $out) for @$v }
    elsif (defined $v && !ref $v) {
        while ($v =~ /\$\{([^{}]*)\}/g) {
            my $in = $1;
            my ($best) = sort { length $b <=> length $a } grep { index($in, "$_.") == 0 } map { $_->{id} } @steps;
            push @$out, [$best, substr($in, length($best) + 1), "\${$in}"] if defined $best;
        }
    }
    return $out;
}
sub subst {
    my ($v) = @_;
    return { map { $_ => subst($v->{$_}) } keys %$v } if ref $v eq 'HASH';
    return [ map { subst($_) } @$v ] if ref $v eq 'ARRAY';
    return $v if !defined $v || ref $v || $v !~ /\$\{/;
    my $out = $v;
    for my $r (@{ refs_in($v, []) }) {
        my ($id, $field, $text) = @$r;
        my $d = $done_data{$id};
        die "needs $text, which it does not have\n" unless ref $d eq 'HASH' && defined $d->{$field} && !ref $d->{$field};
        my $val = $d->{$field};
        $out =~ s/\Q$text\E/$val/g;
    }
    return $out;
}

# ---- the wire's main connection and the catalog's approval modes ----
my $W = Wire->new or finish('not done: the vault socket did not answer');
$W->open_session or finish('not done: session.open was refused');
my %mode; my %mutates;
{
    my $c = $W->rpc('catalog', {});
    for my $op (@{ ($c && $c->{result} && $c->{result}{operations}) || [] }) {
        $mode{ $op->{name} } = ($op->{approval} // {})->{mode} // 'session';
        $mutates{ $op->{name} } = $op->{mutates} ? 1 : 0;
    }
    for my $name (keys %{ $task->{catalog} // {} }) {
        $mutates{$name} = 1 if $task->{catalog}{$name}{mutates};   # either says it mutates: treat it so
    }
}
sub parallel_ok { my ($s) = @_; ($mode{ $s->{call} } // '') eq 'auto' && !($mutates{ $s->{call} } // 1) }

sub wait_unlocked {
    my ($w) = @_;
    while (left() > 1) {
        my $a = $w->rpc('vault.status', {});
        return 1 if $a && $a->{result} && !$a->{result}{locked};
        sleep 0.2;
    }
    return 0;
}

sub stopped_elsewhere { -e $STOP_FILE }
sub mark_stop {
    my ($why) = @_;
    if (open my $fh, '>', $STOP_FILE) { print {$fh} "$why\n"; close $fh; }
}

# A step from start to settled on connection $w. Returns [status, detail]:
#   done (data) | failed (this step only) | stop (the task) | waiting (pending info) | late
sub run_step {
    my ($w, $step) = @_;
    my $id = $step->{id};
    my $s = st($id);
    my $op = $step->{call};
    my $key = key_of($step);
    return ['stop', "$op is not one of the task's operations"] unless $allowed{$op};
    my $params = eval { subst($step->{params} // {}) };
    return ['failed', "$id: $@"] if $@;
    my $ans;   # the Result to act on next, if any
    if ($s->{stop}) { return ['stop', $s->{stop}] }
    if ($s->{token}) {
        $ans = resume($w, $s, $op);
        return ['waiting', $s->{pending} // {}] unless defined $ans;
        if (!ref $ans) { $ans = undef; delete $s->{token}; delete $s->{inflight}; save(); }   # the vault forgot it: call again with its key
    } elsif ($s->{inflight}) {
        $ans = reconcile($w, $s, $op, $key);
        return $ans if ref $ans eq 'ARRAY';
    }
    if (!$ans && $s->{retry_at}) {
        my $until = $s->{retry_at};
        return ['late', "$op: rate limited until past the deadline"] if $until > $DEADLINE - 0.5;
        sleep($until - time()) if $until > time();
    }
    my $locked = 0;
    while (1) {
        if (!$ans) {
            return ['failed', "$op: 3 attempts spent"] if ($s->{attempts} // 0) >= 3;
            return ['late', "$op: no time left to send it"] if left() < 0.6;
            return ['stop', 'another worker was told to stop'] if stopped_elsewhere();
            $s->{attempts}++; $s->{inflight} = 1; delete $s->{retry_at}; save();
            my %p = (operation => $op, params => $params, idempotency_key => $key,
                     wait_s => 0 + sprintf('%.2f', max(0, left() - 1.5)));
            my $crash = $CRASH eq $op && !$IS_WORKER && !$state->{crashed};
            if ($crash) { $state->{crashed} = 1; save(); }
            my $m = $w->rpc('call', \%p);
            POSIX::_exit(3) if $crash && $m;   # the answer lost: dies before keeping it
            return ['late', "$op: no answer before the deadline"] unless $m;
            if ($m->{error}) { delete $s->{inflight}; save(); return ['failed', "$op: refused ($m->{error}{code})"]; }
            $ans = $m->{result};
        }
        my $retry = $ans->{retry} // '';
        my $cat = $ans->{category} // '';
        $s->{corr} = $ans->{correlation_id} if $ans->{correlation_id};
        if ($ans->{ok} && $cat eq 'success') {
            delete @$s{qw(inflight token)}; $s->{done} = 1; $s->{data} = $ans->{data} // {};
            $done_data{$id} = $s->{data}; save();
            return ['done', $s->{data}];
        }
        if ($cat eq 'approval_pending' || $retry eq 'after_approval') {
            $s->{token} = $ans->{resume_token}; $s->{pending} = { map { $_ => $ans->{$_} } grep { defined $ans->{$_} } qw(owner deadline request_id) };
            save();
            my $next = resume($w, $s, $op);
            return ['waiting', $s->{pending}] unless defined $next;
            return ['stop', "$op: its resume token was refused"] unless ref $next;
            $ans = $next; next;
        }
        delete $s->{token};
        if ($NEVER{$retry}) { delete $s->{inflight}; $s->{stop} = "$op: $cat"; save(); return ['stop', "$op: $cat"] }
        if ($retry eq 'reconcile_first' || $cat eq 'outcome_unknown') {
            my $r = reconcile($w, $s, $op, $key);
            return $r if ref $r eq 'ARRAY';
            $ans = $r; next;
        }
        if ($retry eq 'after_unlock' || $cat eq 'vault_locked') {
            delete $s->{inflight}; $s->{attempts}--; save();   # nothing was sent
            return ['late', "$op: the vault stayed locked"] if ++$locked > 5 || !wait_unlocked($w);
            $ans = undef; next;
        }
        if ($retry eq 'after_delay' || $cat eq 'rate_limited') {
            delete $s->{inflight};
            $s->{retry_at} = time() + ($ans->{retry_after_s} // 1); save();
            return ['failed', "$op: rate limited, 3 attempts spent"] if $s->{attempts} >= 3;
            return ['late', "$op: rate limited past the deadline"] if $s->{retry_at} > $DEADLINE - 0.6;
            sleep(max(0, $s->{retry_at} - time()));
            $ans = undef; next;
        }
        if ($retry eq 'bounded') { delete $s->{inflight}; save(); $ans = undef; next; }
        delete $s->{inflight}; save();
        return ['stop', "$op: $cat ($retry)"];   # nothing here says it may be sent again
    }
}

sub max { my $m = shift; for (@_) { $m = $_ if $_ > $m } $m }

# collect a pending approval: its settled Result, 'forgot' when the vault no longer knows the
# token (a JSON-RPC error), or undef when no time is left (the token stays saved: hand it over)
sub resume {
    my ($w, $s, $op) = @_;
    while (left() > 1.6) {
        my $m = $w->rpc('call.resume', { resume_token => $s->{token}, wait_s => 0 + sprintf('%.2f', max(0, left() - 1.5)) });
        return undef unless $m;
        return 'forgot' if $m->{error};
        my $r = $m->{result};
        return $r unless ($r->{category} // '') eq 'approval_pending';
        sleep 0.05;
    }
    return undef;
}

# section 6: a step whose outcome is unknown (or whose send a predecessor did not see answered).
# Returns a Result to act on (a resend allowed: undef), or a final [status, detail].
sub reconcile {
    my ($w, $s, $op, $key) = @_;
    my @pause = (0.1, 0.2, 0.4, 0.8);
    while (1) {
        return ['late', "$op: outcome unknown, no time left to look it up"] if left() < 0.6;
        my %q = (operation => $op);
        if ($s->{corr} && !$s->{corr_stale}) { $q{correlation_id} = $s->{corr} } else { $q{idempotency_key} = $key }
        my $m = $w->rpc('lookup', \%q);
        return ['late', "$op: the lookup was not answered in time"] unless $m;
        if ($m->{error}) {
            # an id the vault does not know (a restart's): ask by the step's key instead
            if ($q{correlation_id}) { $s->{corr_stale} = 1; next }
            $s->{stop} = "$op: its outcome could not be looked up"; save();
            return ['stop', $s->{stop}];
        }
        my $r = $m->{result};
        my ($cat, $rec, $retry) = map { $r->{$_} // '' } qw(category reconciled retry);
        if ($rec eq 'found' || $rec eq 'not_found') {
            if ($cat ne 'success') { return $r }   # the call's own answer
            if ($rec eq 'found') {
                my $c = ref $r->{data} eq 'HASH' ? $r->{data}{created} : undef;
                return { ok => JSON::PP::true, category => 'success', data => (ref $c eq 'ARRAY' && @$c ? $c->[0] : {}) };
            }
            delete $s->{inflight}; save();
            return undef;   # not found: sending it again under its key is allowed
        }
        if ($r->{resume_token}) { return { %$r, category => 'approval_pending', retry => 'after_approval' } }
        if ($NEVER{$retry}) { $s->{stop} = "$op: $cat"; save(); return ['stop', $s->{stop}] }
        if ($cat eq 'rate_limited') {
            my $d = $r->{retry_after_s} // 0.25;
            return ['late', "$op: its lookup is paced past the deadline"] if time() + $d > $DEADLINE - 0.6;
            sleep $d; next;
        }
        if (!@pause) { $s->{stop} = "$op: its outcome stays unknown"; save(); return ['stop', $s->{stop}] }
        my $d = shift @pause;
        sleep $d if left() > $d + 0.6;
    }
}

# ---- workers: independent reads side by side, each in its own process and session ----
sub run_batch {
    my (@batch) = @_;
    my %kids;
    # every worker opens its session, then waits for the last one forked: their calls go out together,
    # so none is sent after a sibling's answer came (a `never` there stops the task, section 4)
    pipe(my $go_r, my $go_w) or return map { [$_, ['failed', "pipe: $!"]] } @batch;
    for my $step (@batch) {
        pipe(my $r, my $wr) or return map { [$_, ['failed', "pipe: $!"]] } @batch;
        STDOUT->flush; STDERR->flush;
        my $pid = fork;
        if (!defined $pid) { close $r; close $wr; $kids{"x$step->{id}"} = [$step, undef, ['failed', "fork: $!"]]; next }
        if ($pid == 0) {
            close $r; close $go_w;
            $IS_WORKER = 1;
            close $W->{s};
            my $res;
            my $w = Wire->new;
            my $ok = $w && $w->open_session;
            { local $/; my $x = <$go_r>; }   # EOF: every worker is started
            close $go_r;
            if (!$ok) { $res = ['failed', 'no session'] }
            else {
                $res = run_step($w, $step);
                mark_stop($res->[1]) if $res->[0] eq 'stop';
                $w->rpc('session.close', {}, time() + 0.3) if left() > 0.5;
            }
            print {$wr} $JSON->encode({ res => $res, s => st($step->{id}) });
            close $wr;
            POSIX::_exit(0);
        }
        close $wr;
        $kids{$pid} = [$step, $r];
    }
    close $go_w; close $go_r;
    my @out;
    for my $pid (keys %kids) {
        my ($step, $r, $res) = @{ $kids{$pid} };
        if ($r) {
            local $/; my $t = <$r>; close $r;
            waitpid($pid, 0);
            my $got = eval { $JSON->decode($t // '') };
            if ($got) { $state->{steps}{ $step->{id} } = $got->{s}; $res = $got->{res}; $done_data{ $step->{id} } = $got->{s}{data} if $got->{s}{done} }
            else { $res = ['failed', "the worker for $step->{id} ended without a word"] }
        }
        push @out, [$step, $res];
    }
    save();
    return @out;
}

# ---- the run ----
if ($state->{stopped}) { finish("not done: stopped earlier: $state->{stopped}") }
if (-e $STOP_FILE) { finish('not done: a worker was told to stop') }
wait_unlocked($W) or finish('not done: the vault stayed locked until the deadline');

my (@failed, $waiting, $late);
my %bad;   # steps not done: later steps needing their data cannot run
my $i = 0;
STEP: while ($i < @steps) {
    my $step = $steps[$i];
    if ($done_data{ $step->{id} } || st($step->{id})->{done}) { $i++; next }
    my @needs = map { $_->[0] } @{ refs_in($step->{params}, []) };
    if (grep { $bad{$_} } @needs) { $bad{ $step->{id} } = 1; push @failed, "$step->{id} (needs an undone step)"; $i++; next }
    my @batch = ($step);
    if (parallel_ok($step)) {
        my %in = ($step->{id} => 1);
        while ($i + @batch < @steps && @batch < 8) {
            my $n = $steps[$i + @batch];
            last unless parallel_ok($n) && !$done_data{ $n->{id} };
            last if grep { $in{ $_->[0] } || !$done_data{ $_->[0] } } @{ refs_in($n->{params}, []) };
            $in{ $n->{id} } = 1; push @batch, $n;
        }
    }
    my @res = parallel_ok($step) ? run_batch(@batch) : ([$step, run_step($W, $step)]);
    $i += @batch;
    for (@res) {
        my ($s, $r) = @$_;
        my ($how, $detail) = @$r;
        next if $how eq 'done';
        $bad{ $s->{id} } = 1;
        if ($how eq 'failed') { push @failed, "$s->{id}: $detail"; next }
        if ($how eq 'waiting') { $waiting = [$s, $detail]; next }
        if ($how eq 'late') { $late = "$s->{id}: $detail"; next }
        $state->{stopped} = "$s->{id}: $detail"; save();
        $W->rpc('session.close', {}, time() + 0.3) if left() > 0.5;
        finish("not done: stopped: $state->{stopped}");
    }
    last if $waiting || $late;
}
$W->rpc('session.close', {}, time() + 0.3) if left() > 0.5;
if ($waiting) {
    my ($s, $p) = @$waiting;
    finish(sprintf('waiting: %s needs approval from %s before %s (request %s)', $s->{call},
                   $p->{owner} // 'its owner', $p->{deadline} // 'its deadline', $p->{request_id} // '?'));
}
finish("not done: $late") if $late;
finish('not done: ' . join('; ', @failed)) if @failed;
finish(sprintf('done: %d of %d steps succeeded', scalar(@steps), scalar(@steps)));
