#!/usr/bin/perl
# An agent that gives up on a call it is still waiting for, written from docs/agent-contract.md.
#
# It opens its session, sends its first step's call with wait_s 2.5 s, but reads for the
# answer only 0.5 s (a client-side timeout shorter than its wait_s, as many HTTP-style clients
# have), then says honestly that it did not finish and exits (RT8C_WAIT_S: another wait_s). The
# vault is still holding the call when the process leaves; no approver ever left while it lived.
#
# Not used by a test yet: it reproduces a verdict that names the wrong party (see the red-team
# report of pass 8). `vaultsim run -k "gate-2 or refusal-1" --agent "perl tests/agents/rt8c_abandon.pl"`:
# gate-2 is FAIL_UNROUTED_WAIT ("no approver could receive": the approver was connected; the
# runner's teardown settled the held call unroutable after the agent had gone), and refusal-1
# is PASS on a denial the agent never received.
use strict;
use warnings;
use IO::Socket::UNIX;
use Socket qw(SOCK_STREAM);
use JSON::PP;

$| = 1;
my $json = JSON::PP->new->canonical;
open(my $tf, '<', $ENV{VAULTSIM_TASK}) or die "no task: $!";
my $task = $json->decode(do { local $/; <$tf> });
close $tf;
my $sock = IO::Socket::UNIX->new(Type => SOCK_STREAM, Peer => $ENV{VAULTSIM_SOCKET}) or die "connect: $!";

sub ask {
    my ($id, $method, $params, $timeout) = @_;
    print $sock $json->encode({ jsonrpc => '2.0', id => $id, method => $method, params => $params }), "\n";
    my $rin = '';
    vec($rin, fileno($sock), 1) = 1;
    return undef unless select(my $r = $rin, undef, undef, $timeout);
    my $line = <$sock>;
    return $line ? $json->decode($line) : undef;
}

my $open = ask(1, 'session.open', { agent => $task->{agent}, run_id => $ENV{VAULTSIM_RUN_ID} }, 10);
my $sid = $open->{result}{session_id} or die "no session";
my $step = $task->{steps}[0];
my $answer = ask(2, 'call', { session_id => $sid, operation => $step->{call}, params => $step->{params},
                              idempotency_key => "$ENV{VAULTSIM_RUN_ID}:$task->{agent}:$step->{id}",
                              wait_s => ($ENV{RT8C_WAIT_S} // 2.5) }, 0.5);
if ($answer) {
    print "not done: $step->{call} answered $answer->{result}{category}\n";
} else {
    print "not done: no answer from the vault for $step->{call} within my own 0.5 s timeout\n";
}
# RT8C_LINGER: seconds it stays, connection open and unread, before it exits (a loaded host's slow exit)
select(undef, undef, undef, $ENV{RT8C_LINGER}) if $ENV{RT8C_LINGER};
exit 0;
