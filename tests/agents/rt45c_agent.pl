#!/usr/bin/perl
# Red team 45c: a careful agent in Perl (core modules only: IO::Socket::UNIX, JSON::PP,
# Time::HiRes, File::Spec), written from docs/agent-contract.md.
#
# Shape: a dispatch table of category handlers (a hash of code refs) drives each step; state is
# a JSON file in state_dir replaced by a rename inside state_dir (section 1). Rules kept: one
# session on one connection (3); key RUN:AGENT:STEP on every call and resend (5); a lookup before
# anything else after outcome_unknown, its category read before its reconciled (6); waits
# resumed until settled or handed over with the token kept (4, 7); retry_after_s waited out, at
# most 3 attempts (4); a never/human_required answer stops the task (4); a restart resumes or
# looks up what it kept (8); the final message last (7).
use strict;
use warnings;
use IO::Socket::UNIX;
use JSON::PP;
use Time::HiRes qw(time sleep);
use File::Spec;

$| = 1;
my $json = JSON::PP->new->utf8->canonical;
my $task = do {
    open my $fh, '<:raw', $ENV{VAULTSIM_TASK} or die "task: $!";
    local $/; $json->decode(<$fh>);
};
my $deadline = $task->{deadline} + 0;
my $margin = 0.8;
my $state_dir = $task->{state_dir};
mkdir $state_dir unless -d $state_dir;
my $state_path = File::Spec->catfile($state_dir, 'rt45c-perl.json');
my $state = {};
if (open my $fh, '<:raw', $state_path) { local $/; my $t = <$fh>; $state = eval { $json->decode($t) } || {}; }

sub logmsg { print STDERR "[rt45c-perl] @_\n"; }
sub left { return $deadline - time() - $margin; }
sub nap { my $s = shift; my $l = left(); $s = $l if $s > $l; sleep($s) if $s > 0; }

sub save {
    my $tmp = "$state_path.$$.tmp";
    open my $fh, '>:raw', $tmp or die "state: $!";
    print $fh $json->encode($state);
    close $fh or die "state: $!";
    rename $tmp, $state_path or die "state: $!";
}

# ---- the connection ------------------------------------------------------------------------
my $sock;
for (my $pause = 0.05; ; $pause = $pause * 2 > 0.5 ? 0.5 : $pause * 2) {
    $sock = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => $ENV{VAULTSIM_SOCKET});
    last if $sock;
    # a full accept queue (EAGAIN) is not a missing vault: back off (3)
    die "connect: $!\n" unless $!{EAGAIN} && time() + $pause < $deadline - 1;
    sleep $pause;
}
binmode $sock;
my $buf = '';
my $next_id = 0;

sub rpc {
    my ($method, $params) = @_;
    die { stop => "the deadline came before $method could be sent" } if time() > $deadline - 0.25;
    my $id = ++$next_id;
    print {$sock} $json->encode({jsonrpc => '2.0', id => $id, method => $method, params => $params || {}}) . "\n";
    $sock->flush;
    while (1) {
        while ($buf !~ /\n/) {
            my $n = sysread($sock, my $chunk, 65536);
            die { stop => 'the vault closed the connection' } unless $n;
            $buf .= $chunk;
        }
        $buf =~ s/^([^\n]*)\n//;
        my $msg = eval { $json->decode($1) };
        next unless ref $msg eq 'HASH' && defined $msg->{id} && $msg->{id} eq $id;
        die { refused => ($msg->{error}{message} // 'error') } if $msg->{error};
        return $msg->{result} || {};
    }
}

my $sid = rpc('session.open', {agent => $task->{agent}, run_id => $task->{run_id},
                               client => {name => 'rt45c-perl', version => '45.0'}})->{session_id};

sub req {
    my ($method, %p) = @_;
    my $res = rpc($method, {session_id => $sid, %p});
    logmsg("$method -> " . ($res->{category} // '?') . ' ' . ($res->{reconciled} // ''));
    return $res;
}
sub wait_s { my $w = left() - 0.3; $w = 0 if $w < 0; return 0 + sprintf('%.2f', $w); }

# ---- steps ----------------------------------------------------------------------------------
my (%data, %outcome, @waiting);
for my $k (keys %$state) { if ($state->{$k}{data}) { $data{$k} = $state->{$k}{data}; $outcome{$k} = 'done'; } }

sub fill {
    my $v = shift;
    if (ref $v eq 'HASH') { return { map { $_ => fill($v->{$_}) } keys %$v }; }
    if (ref $v eq 'ARRAY') { return [ map { fill($_) } @$v ]; }
    return $v if ref $v || !defined $v;
    $v =~ s/\$\{([^.}]+)\.([^}]+)\}/
        defined $data{$1} && defined $data{$1}{$2} ? "$data{$1}{$2}" : die { stop => "step $1 gave no $2" }/ge;
    return $v;
}
sub refs_of {
    my $v = shift;
    return map { refs_of($_) } values %$v if ref $v eq 'HASH';
    return map { refs_of($_) } @$v if ref $v eq 'ARRAY';
    return () if ref $v || !defined $v;
    return $v =~ /\$\{([^.}]+)\./g;
}

sub lookup {
    my ($ref, $op) = @_;
    my $res = {};
    for my $pause (0, 0.1, 0.2, 0.4) {
        if ($pause) { last if $pause > left(); nap($pause); }
        $res = req('lookup', operation => $op, %$ref);
        my $r = $res->{reconciled} // '';
        return $res if $r eq 'found' || $r eq 'not_found' || $res->{resume_token}
            || ($res->{category} // '') eq 'rate_limited' || ($res->{retry} // '') =~ /^(never|human_required)$/;
    }
    return $res;
}

sub collect {
    my ($step, $rec, $res) = @_;
    my $token = $res->{resume_token};
    $rec->{token} = $token; save();
    while (1) {
        if (left() <= 0.4) {
            push @waiting, "$step->{call} ($step->{id}) awaits " . ($res->{owner} // 'its owner');
            return 'waiting';
        }
        my ($asked, $w) = (time(), wait_s());
        my $nxt = eval { req('call.resume', resume_token => $token, wait_s => $w) };
        if (!$nxt) {
            my $e = $@; die $e unless ref $e eq 'HASH' && $e->{refused};
            delete $rec->{token}; save(); return undef;     # the vault forgot it: call again
        }
        if (($nxt->{category} // '') ne 'approval_pending') { delete $rec->{token}; save(); return $nxt; }
        $res = $nxt;
        nap(0.2) if $w > 1 && time() - $asked < $w / 2;
    }
}

sub finish_step {
    my ($sid_, $rec, $d) = @_;
    delete $rec->{token};
    $rec->{data} = ref $d eq 'HASH' ? $d : {};
    $data{$sid_} = $rec->{data};
    save();
    return 'done';
}

sub run_step {
    my $step = shift;
    my ($id, $op) = ($step->{id}, $step->{call});
    my $key = "$task->{run_id}:$task->{agent}:$id";
    my $rec = $state->{$id} ||= {};
    my $params = fill($step->{params} || {});
    my $ref = {idempotency_key => $key};
    my $res;
    if ($rec->{token}) {
        $res = eval { req('call.resume', resume_token => $rec->{token}, wait_s => wait_s()) };
        if (!$res) { my $e = $@; die $e unless ref $e eq 'HASH' && $e->{refused}; delete $rec->{token}; save(); }
    } elsif ($rec->{sent}) {
        $res = lookup($ref, $op);
    }
    my %on;
    %on = (
        success => sub { finish_step($id, $rec, $res->{data}) },
        approval_pending => sub { collect($step, $rec, $res) },
        outcome_unknown => sub { $ref = {correlation_id => $res->{correlation_id}}; lookup($ref, $op) },
        rate_limited => sub {
            my $after = $res->{retry_after_s} // 1;
            if (($res->{reconciled} // '') eq 'unknown') {
                die { stop => "$op ($id): outcome unknown, no time to look it up again" } if $after > left();
                nap($after); return lookup($ref, $op);
            }
            return 'failed' if ($rec->{attempts} // 0) >= 3 || $after > left() - 0.3;
            nap($after); return undef;
        },
        local_failure => sub { return 'failed' if ($rec->{attempts} // 0) >= 3; nap(0.2); undef },
        confirmed_failure => sub { $on{local_failure}->() },
        vault_locked => sub {
            while (rpc('vault.status')->{locked}) {
                die { stop => "the vault stayed locked; $op ($id) not sent" } if left() < 0.5;
                nap(0.3);
            }
            return undef;
        },
    );
    while (1) {
        if (!$res) {
            return 'failed' if ($rec->{attempts} // 0) >= 3 || left() <= 0.2;
            $rec->{sent} = JSON::PP::true; $rec->{attempts} = ($rec->{attempts} // 0) + 1; save();
            $res = eval { req('call', operation => $op, params => $params, idempotency_key => $key, wait_s => wait_s()) };
            if (!$res) { my $e = $@; die $e unless ref $e eq 'HASH' && $e->{refused}; logmsg("$id refused"); return 'failed'; }
        }
        my ($cat, $retry, $recon) = ($res->{category} // '', $res->{retry} // '', $res->{reconciled});
        my $nxt;
        if (defined $recon && $cat eq 'success') {            # a lookup answered (6)
            if ($recon eq 'found') {
                my $c = ($res->{data} || {})->{created} || [{}];
                return finish_step($id, $rec, $c->[0]);
            }
            if ($recon eq 'not_found') { $res = undef; next; }
            die { stop => "$op ($id): outcome unknown; a person must inspect it" } unless $res->{resume_token};
            $nxt = collect($step, $rec, $res);
        } elsif (defined $recon && $recon eq 'unknown' && $cat ne 'rate_limited' && $cat ne 'approval_pending'
                 && $retry !~ /^(never|human_required)$/) {
            die { stop => "$op ($id): the lookup failed ($cat); a person must inspect it" } unless $res->{resume_token};
            $nxt = collect($step, $rec, $res);
        } elsif ($cat eq 'success' || $cat eq 'approval_pending') {
            $nxt = $on{$cat}->();
        } elsif ($retry eq 'never' || $retry eq 'human_required') {
            die { stop => "$op ($id) answered $cat (retry: $retry)" };
        } elsif ($on{$cat}) {
            $nxt = $on{$cat}->();
        } else {
            die { stop => "$op ($id) answered $cat ($retry)" };
        }
        return $nxt if defined $nxt && !ref $nxt;
        $res = $nxt;
    }
}

my @steps = @{ $task->{steps} || [] };
my $message;
my $ok = eval {
    for my $step (@steps) {
        next if ($outcome{$step->{id}} // '') eq 'done';
        if (grep { ($outcome{$_} // '') ne 'done' } refs_of($step->{params})) { $outcome{$step->{id}} = 'failed'; next; }
        last if @waiting;
        $outcome{$step->{id}} = run_step($step);
    }
    1;
};
if (!$ok) {
    my $e = $@;
    $message = 'not done: ' . (ref $e eq 'HASH' ? ($e->{stop} // "refused: $e->{refused}") : "error: $e");
    $message =~ s/\s+$//;
} elsif (!grep { ($outcome{$_->{id}} // '') ne 'done' } @steps) {
    $message = 'done: ' . scalar(@steps) . ' steps';
} elsif (@waiting) {
    $message = 'waiting: ' . join('; ', @waiting) . ' (token kept in state_dir)';
} else {
    $message = 'not done: ' . join(', ', map { $_->{id} } grep { ($outcome{$_->{id}} // '') ne 'done' } @steps);
}
eval { rpc('session.close', {session_id => $sid}) if left() > -0.5; };
close $sock;
print "$message\n";
exit 0;
