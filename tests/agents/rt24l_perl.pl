#!/usr/bin/env perl
# A careful agent in Perl (core modules only: JSON::PP, IO::Socket::UNIX, Time::HiRes), written from
# docs/agent-contract.md alone. Blocking style (wait_s up to the deadline), state kept in state_dir
# (written in state_dir and renamed there), a lookup after outcome_unknown, a `never` answer stops
# the task. Final message: "DONE: ..." / "NOT DONE: ..." / "WAITING: ..." (section 7's words).
# LOOKUP_FIRST=1: before each step's first call, a lookup by its idempotency key (§6: a lookup is
# always allowed), and a step found done is not sent. With LOOKUP_STOPS=1 too, a lookup answered
# with a `never` or `human_required` retry stops the task there, as §4 says of any such answer.
use strict;
use warnings;
use IO::Socket::UNIX;
use JSON::PP;
use Time::HiRes qw(time sleep);

$| = 1;
my $json = JSON::PP->new->utf8->canonical;
my $task = do { local (@ARGV, $/) = ($ENV{VAULTSIM_TASK}); $json->decode(<>) };
my $run_id = $ENV{VAULTSIM_RUN_ID};
my $agent = $task->{agent};
my $deadline = $task->{deadline};
my $state_path = "$task->{state_dir}/perl-agent.json";
my $state = -e $state_path ? do { local (@ARGV, $/) = ($state_path); $json->decode(<>) } : {done => {}, pending => {}};

sub logm { print STDERR "perl-agent: @_\n" }
sub left { my $t = $deadline - time; $t > 0 ? $t : 0 }

sub save {
    my $tmp = "$state_path.tmp";
    open my $f, '>', $tmp or die "state: $!";
    print $f $json->encode($state);
    close $f or die "state: $!";
    rename $tmp, $state_path or die "state: $!";
}

my $sock;
sub finish {
    my ($line) = @_;
    print "$line\n";
    close $sock if $sock;
    exit 0;
}

$sock = IO::Socket::UNIX->new(Type => SOCK_STREAM, Peer => $ENV{VAULTSIM_SOCKET})
    or finish("NOT DONE: the vault's socket cannot be reached");
my $next = 0;

sub rpc {
    my ($method, $params) = @_;
    my $id = ++$next;
    finish("NOT DONE: deadline reached before $method") if left() < 0.05;
    print $sock $json->encode({jsonrpc => "2.0", id => $id, method => $method, params => $params}), "\n";
    my $until = time + left() + 1;
    while (time < $until) {
        my $line = <$sock>;
        finish("NOT DONE: the vault closed the connection") unless defined $line;
        my $msg = eval { $json->decode($line) } or next;
        next unless defined $msg->{id} && $msg->{id} eq $id;
        return $msg;
    }
    finish("NOT DONE: the vault did not answer in time");
}

sub fill {
    my ($v) = @_;
    if (ref $v eq 'HASH') { return {map { $_ => fill($v->{$_}) } keys %$v} }
    if (ref $v eq 'ARRAY') { return [map { fill($_) } @$v] }
    return $v if ref $v || !defined $v;
    $v =~ s/\$\{([^.}]+)\.([^}]+)\}/
        my $d = $state->{done}{$1}; defined $d && defined $d->{$2} ? $d->{$2} : die "missing $1.$2\n"/ge;
    return $v;
}

my $open = rpc("session.open", {agent => $agent, run_id => $run_id, client => {name => "perl-agent"}});
my $sid = $open->{result}{session_id} or finish("NOT DONE: session.open refused");
my %allowed = map { $_ => 1 } @{$task->{operations}};
my $n = scalar @{$task->{steps}};

STEP: for my $step (@{$task->{steps}}) {
    my ($id, $op) = ($step->{id}, $step->{call});
    if (exists $state->{done}{$id}) { logm("$id already done"); next }
    finish("NOT DONE: $id: $op is not an operation of my task") unless $allowed{$op};
    my $params = eval { fill($step->{params} || {}) } or finish("NOT DONE: $id: a parameter refers to data I do not have");
    my $key = "$run_id:$agent:$id";
    my $token = $state->{pending}{$id};
    my $attempts = 0;
    if ($ENV{LOOKUP_FIRST} && !defined $token) {
        # check before acting: was this step's key already carried out (by a predecessor)?
        my $look = rpc("lookup", {session_id => $sid, idempotency_key => $key, operation => $op});
        my $rec = $look->{result}{reconciled} // 'none';
        logm("$id lookup first -> $rec");
        my $lr = $look->{result}{retry} // '';
        finish("NOT DONE: $id: " . $look->{result}{category}) if $ENV{LOOKUP_STOPS} && ($lr eq 'never' || $lr eq 'human_required');
        if ($rec eq 'found') {
            my $created = $look->{result}{data}{created} || [];
            $state->{done}{$id} = $created->[0] || {}; save();
            next STEP;
        }
    }
    while (1) {
        my $wait = left() - 2; $wait = 30 if $wait > 30; $wait = 0 if $wait < 0;
        my $ans;
        if (defined $token) {
            $ans = rpc("call.resume", {session_id => $sid, resume_token => $token, wait_s => $wait + 0.0});
            if ($ans->{error}) {
                logm("$id: the token is no longer known; calling again");
                undef $token; delete $state->{pending}{$id}; save();
                next;
            }
        } else {
            finish("NOT DONE: $id: three attempts failed") if $attempts >= 3;
            $attempts++;
            $ans = rpc("call", {session_id => $sid, operation => $op, params => $params,
                                idempotency_key => $key, wait_s => $wait + 0.0});
            finish("NOT DONE: $id: the vault refused the request") if $ans->{error};
        }
        my $r = $ans->{result};
        my $cat = $r->{category};
        logm("$id $op -> $cat");
        if ($cat eq 'success') {
            $state->{done}{$id} = $r->{data} || {}; delete $state->{pending}{$id}; save();
            next STEP;
        } elsif ($cat eq 'local_failure' || $cat eq 'confirmed_failure') {
            undef $token;
        } elsif ($cat eq 'rate_limited') {
            undef $token;
            my $d = $r->{retry_after_s} // 1;
            finish("NOT DONE: $id: rate limited") if $attempts >= 3 || left() < $d + 1;
            sleep $d;
        } elsif ($cat eq 'vault_locked') {
            undef $token;
            while (1) {
                finish("NOT DONE: $id: the vault stayed locked") if left() < 1.5;
                my $s = rpc("vault.status", {});
                last if !$s->{result}{locked};
                sleep 0.2;
            }
        } elsif ($cat eq 'outcome_unknown') {
            undef $token;
            my $rec = 'unknown';
            my $look;
            for my $pause (0, 0.1, 0.2, 0.4) {
                sleep $pause;
                $look = rpc("lookup", {session_id => $sid, correlation_id => $r->{correlation_id}});
                $rec = $look->{result}{reconciled} // 'error';
                logm("$id lookup -> $rec");
                last if $rec ne 'unknown';
            }
            if ($rec eq 'found') {
                my $created = $look->{result}{data}{created} || [];
                $state->{done}{$id} = $created->[0] || {}; save();
                next STEP;
            }
            finish("NOT DONE: $id: its outcome is unknown; a person must inspect it") unless $rec eq 'not_found';
        } elsif ($cat eq 'approval_pending') {
            $token = $r->{resume_token};
            $state->{pending}{$id} = $token; save();
            finish("WAITING: $id ($op) needs approval from $r->{owner} before $r->{deadline}") if left() < 3;
        } else {
            delete $state->{pending}{$id}; save();
            finish("NOT DONE: $id: $cat");
        }
    }
}
rpc("session.close", {session_id => $sid});
finish("DONE: all $n steps succeeded");
