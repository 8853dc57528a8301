#!/usr/bin/perl
# A careful agent in Perl (core modules only), written from docs/agent-contract.md alone.
#
# Styles (environment, all optional; each one valid under the contract):
#   RT8C_IDS     int (default) | string | negative | huge       request id shapes
#   RT8C_WIRE    plain (default) | escaped | spaced             escaped: every string char as \uXXXX,
#                                                               spaced: reversed keys, extra blanks
#   RT8C_WAIT    block (default) | poll                         one long wait_s, or wait_s 0 + resumes
#   RT8C_LOOKUP  0 (default) | 1                                lookup by key before any resend
#   (RT8C_LOOKUP also: 2 = also look every step up by its key before its first call)
#   RT8C_STATUS_FIRST 0 (default) | 1                           read vault.status before each call and
#                                                               send nothing while it says locked
#   RT8C_HEARTBEAT    0 (default) | 1                           vault.status on the same connection
#                                                               every second while a call waits
#   RT8C_KEY     run (default: RUN_ID:AGENT:STEP_ID) | stepid | sha   idempotency key shape
#   RT8C_RELOOK  0 (default) | 1                                a restart looks a saved pending step up
#                                                               by its key before resuming it
#   RT8C_MCP     path of `vaultsim`: talk MCP (stdio, 2025 handshake) to `vaultsim mcp` started as
#                a child instead of the socket: one tool per operation, vault_resume, vault_lookup
#   RT8C_VERIFY  0 (default) | 1                                look up every success by its correlation id
#   (RT8C_FINAL also: ws = blank and whitespace-only lines after the final line;
#    split = the final line written in pieces, a pause between them)
#   RT8C_RESEND  0 (default) | 1                                after outcome_unknown, an operation whose
#                                                               catalog says idempotent is resent under
#                                                               its key (a reconciliation, section 6)
#   RT8C_PERSIST 0 (default) | 1                                an `unknown` lookup is asked again with
#                                                               backoff until shortly before the deadline
#   (RT8C_FINAL also: latin1 = accented text printed without an encoding layer: Latin-1 bytes)
#   RT8C_NUM     plain (default) | exp                          wait_s written in exponent form
#   (RT8C_FINAL also: nested = a pretty-printed object whose `steps` list holds an object per step)
#   RT8C_CONN    one (default) | percall                        percall: the session opened on a
#                                                               connection kept open, every other
#                                                               request on a fresh connection
#   (RT8C_WAIT also: sleep = wait_s 0 everywhere, half a second's sleep between resumes)
#   RT8C_SELFEXPIRE 0 (default) | 1                             a pending call whose approval deadline
#                                                               has passed is taken as expired, unasked
#   RT8C_STATEWRITE  dir (default) | tmpdir                     where the state file is written before
#                                                               its rename into state_dir
#   RT8C_MCP_HTTP  1: with RT8C_MCP, the bridge on Streamable HTTP (127.0.0.1, a free port), over HTTP::Tiny
#   RT8C_WAITSOCK  stat | listdir                                wait for the socket to exist first
#   (RT8C_FINAL also: jsoncase = JSON `status` words capitalised: Done / Waiting / Not Done)
#   RT8C_SLACK   seconds added to retry_after_s (default 0.2)
#   RT8C_FINAL   text (default) | json | jsonok | stderr        how the final message is printed
#   RT8C_PIPE    0 (default) | 1                                vault.status + catalog pipelined
#                                                               with session.open, answers matched by id
#   RT8C_SHUTWR  0 (default) | 1 | last                         1: after the last step, session.close
#                                                               then shutdown(SHUT_WR), then read;
#                                                               last: shut it right after sending the
#                                                               last step's call (block mode only)
#   RT8C_CHATTY  0 (default) | 1 | out                          log every line sent and received
#                                                               (1: on stderr, out: on stdout)
#   RT8C_CLIENT  0 (default) | 1                                a `client` label on session.open
#   (RT8C_IDS also: same = the id 7 for every request, one in flight at a time;
#    RT8C_FINAL also: color | crlf | json2 (status words completed / awaiting_approval / failed))
use strict;
use warnings;
use IO::Socket::UNIX;
use Socket qw(SOCK_STREAM SHUT_WR);
use JSON::PP;
use Time::HiRes qw(time sleep);

$| = 1;
my $IDS    = $ENV{RT8C_IDS}    // 'int';
my $WIRE   = $ENV{RT8C_WIRE}   // 'plain';
my $WAIT   = $ENV{RT8C_WAIT}   // 'block';
my $LOOKUP = $ENV{RT8C_LOOKUP} // '0';
my $SLACK  = $ENV{RT8C_SLACK}  // '0.2';
my $FINAL  = $ENV{RT8C_FINAL}  // 'text';
my $PIPE   = $ENV{RT8C_PIPE}   // '0';
my $SHUTWR = $ENV{RT8C_SHUTWR} // '0';
my $CHATTY = $ENV{RT8C_CHATTY} // '0';

my $dec = JSON::PP->new->utf8->allow_bignum;
my $enc = JSON::PP->new->utf8->canonical->allow_bignum;
if ($WIRE eq 'spaced') {
    $enc = JSON::PP->new->utf8->allow_bignum->space_before->space_after;
    $enc->sort_by(sub { $JSON::PP::b cmp $JSON::PP::a });
}

my $CLIENT = $ENV{RT8C_CLIENT} // '0';
my $STATUS_FIRST = $ENV{RT8C_STATUS_FIRST} // '0';
my $HEARTBEAT = $ENV{RT8C_HEARTBEAT} // '0';
# one id for every request only works with one request in flight: no heartbeat, no pipelining
($HEARTBEAT, $PIPE) = ('0', '0') if $IDS eq 'same';
sub logline {
    return unless $CHATTY;
    my $l = join(' ', @_); $l =~ s/\s+$//;
    if ($CHATTY eq 'out') { print STDOUT "[perl-agent] $l\n"; } else { print STDERR "[perl-agent] $l\n"; }
}

open(my $tf, '<', $ENV{VAULTSIM_TASK}) or die "no task file: $!";
my $task = $dec->decode(do { local $/; <$tf> });
close $tf;
my $deadline = $task->{deadline};
my $run_id = $ENV{VAULTSIM_RUN_ID} // $task->{run_id};
my $agent = $task->{agent};
my $state_dir = $task->{state_dir};
my %allowed = map { $_ => 1 } @{ $task->{operations} || [] };
my $state_file = "$state_dir/perl-agent-state.json";

# ---- state kept for a restart ----
my $state = { done => {}, pending => {} };
if (-f $state_file) {
    open(my $sf, '<', $state_file) or die;
    $state = $dec->decode(do { local $/; <$sf> });
    close $sf;
}
sub save_state {
    my $tmp = "$state_file.tmp";
    # tmpdir: written in $TMPDIR first, then renamed into state_dir
    $tmp = ($ENV{TMPDIR} // '/tmp') . "/perl-agent-state.$$.tmp" if ($ENV{RT8C_STATEWRITE} // '') eq 'tmpdir';
    open(my $o, '>', $tmp) or die "cannot write state: $!";
    print $o $enc->encode($state);
    close $o;
    rename $tmp, $state_file or die "rename: $!";
}

sub remaining { return $deadline - time(); }
# what we keep back at the end: exit, print, a slow host
my $MARGIN = $ENV{RT8C_MARGIN} // 0.8;

# ---- wire ----
my $counter = 0;
sub next_id {
    $counter++;
    return "req-$counter/\x{e9}t\x{e9}" if $IDS eq 'string';
    return -$counter if $IDS eq 'negative';
    return 7 if $IDS eq 'same';    # one request at a time: an id may be used again once answered
    return Math::BigInt->new('9223372036854775807')->badd(Math::BigInt->new($counter) * 1000003)
        if $IDS eq 'huge';
    return $counter;
}
require Math::BigInt if $IDS eq 'huge';

sub escape_all {
    my ($inner) = @_;
    # $inner is the body of a JSON string as JSON::PP wrote it (UTF-8 bytes, with escapes)
    my $out = '';
    while (length $inner) {
        if ($inner =~ s/^(\\u[0-9a-fA-F]{4}|\\.)//) { $out .= $1; next; }
        $inner =~ s/^([\x00-\x7f]|[\xc0-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf7][\x80-\xbf]{3})//
            or die "bad utf8";
        my $ch = $1;
        utf8::decode($ch);
        my $cp = ord $ch;
        if ($cp > 0xffff) {
            $cp -= 0x10000;
            $out .= sprintf('\\u%04x\\u%04x', 0xd800 + ($cp >> 10), 0xdc00 + ($cp & 0x3ff));
        } else {
            $out .= sprintf('\\u%04X', $cp);
        }
    }
    return $out;
}

sub encode_line {
    my ($obj) = @_;
    my $text = $enc->encode($obj);
    if (($ENV{RT8C_NUM} // '') eq 'exp') {
        # numbers in exponent form, as many JSON writers print floats: 2.5 as 2.5E+0, 0 as 0.0e0
        $text =~ s/("wait_s"\s*:\s*)(-?[0-9]+(?:\.[0-9]+)?)(?=[,}\s])/$1 . sprintf('%.6E', $2)/ge;
    }
    if ($WIRE eq 'escaped') {
        $text =~ s/"((?:[^"\\]|\\.)*)"/'"' . escape_all($1) . '"'/ge;
    } elsif ($WIRE eq 'spaced') {
        $text = " \t$text \t";
    }
    return "$text\n";
}

my $sock;
my $wr_shut = 0;
my $rbuf = '';
my %answers;    # id (as text) -> decoded answer

sub connect_vault {
    my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM, Peer => $ENV{VAULTSIM_SOCKET})
        or die "cannot connect to the vault: $!";
    return $s;
}

sub id_key { my ($id) = @_; return ref($id) ? "$id" : (defined $id ? "$id" : 'null'); }

sub send_req {
    my ($method, $params) = @_;
    return 'never-sent' if $wr_shut;
    my $id = next_id();
    my $line = encode_line({ jsonrpc => '2.0', id => $id, method => $method, params => $params });
    logline("-> $line") ;
    my $off = 0;
    while ($off < length $line) {
        my $n = syswrite($sock, $line, length($line) - $off, $off);
        die "write failed: $!" unless defined $n;
        $off += $n;
    }
    return id_key($id);
}

sub read_answer {
    my ($key, $timeout) = @_;
    return undef if $key eq 'never-sent';
    my $end = time() + $timeout;
    while (1) {
        return delete $answers{$key} if exists $answers{$key};
        while ($rbuf =~ s/^([^\n]*)\n//) {
            my $l = $1;
            next unless $l =~ /\S/;
            logline("<- $l");
            my $msg = eval { $dec->decode($l) };
            next unless ref $msg eq 'HASH' && exists $msg->{id};
            $answers{ id_key($msg->{id}) } = $msg;
        }
        return delete $answers{$key} if exists $answers{$key};
        my $left = $end - time();
        return undef if $left <= 0;
        if ($HEARTBEAT && !$wr_shut && $key ne 'hb') {
            our $last_hb;
            $last_hb //= time();
            if (time() - $last_hb >= 1) { $last_hb = time(); send_req('vault.status', {}); }
            $left = 1 if $left > 1;
        }
        my $rin = '';
        vec($rin, fileno($sock), 1) = 1;
        my $nf = select(my $rout = $rin, undef, undef, $left);
        next unless $nf > 0;
        my $got = sysread($sock, my $chunk, 65536);
        return undef unless $got;    # closed
        $rbuf .= $chunk;
    }
}

my $MCP = $ENV{RT8C_MCP} // '';
my $CONN = $ENV{RT8C_CONN} // 'one';
my ($mcp_pid, $mcp_in, $mcp_out);
my %tool_args;    # tool name -> {arg => 1}

sub rpc {
    my ($method, $params, $timeout) = @_;
    return mcp_rpc($method, $params, $timeout) if $MCP;
    if ($CONN eq 'percall' && $method ne 'session.open' && !$wr_shut) {
        # the session's own connection stays open (the session lives as long as it does); this
        # request goes on a connection of its own, as a session belongs to the process
        my ($keep_sock, $keep_buf) = ($sock, $rbuf);
        $sock = connect_vault(); $rbuf = '';
        my $key = send_req($method, $params);
        my $a = read_answer($key, $timeout // 30);
        close $sock;
        ($sock, $rbuf) = ($keep_sock, $keep_buf);
        return $a;
    }
    my $key = send_req($method, $params);
    return read_answer($key, $timeout // 30);
}

my $HTTP = $ENV{RT8C_MCP_HTTP} // '';    # 1: Streamable HTTP on loopback instead of stdio
my ($http, $http_url, $http_session);

sub mcp_start {
    if ($HTTP) {
        require HTTP::Tiny;
        require IO::Socket::INET;
        my $probe = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1', LocalPort => 0) or die "no port: $!";
        my $port = $probe->sockport; close $probe;
        $mcp_pid = fork() // die "fork: $!";
        if (!$mcp_pid) { open(STDIN, '<', '/dev/null'); exec($MCP, 'mcp', '--http', "127.0.0.1:$port") or die "exec: $!"; }
        $http_url = "http://127.0.0.1:$port/mcp";
        $http = HTTP::Tiny->new(timeout => 60);
        my $until = time() + 15;
        while (time() < $until) {
            my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port);
            if ($c) { close $c; last; }
            sleep 0.1;
        }
    } else {
        require IPC::Open2;
        $mcp_pid = IPC::Open2::open2($mcp_out, $mcp_in, $MCP, 'mcp');
        $sock = $mcp_out;    # read_answer reads from here
    }
    my $init = mcp_send('initialize', { protocolVersion => '2025-06-18', capabilities => {},
                                        clientInfo => { name => 'perl-mcp-host', version => '0.8' } }, 20);
    die "MCP initialize failed" unless $init && $init->{result};
    my $line = encode_line({ jsonrpc => '2.0', method => 'notifications/initialized' });
    if ($HTTP) { http_post($line); } else { print $mcp_in $line; $mcp_in->flush; }
    my $tl = mcp_send('tools/list', {}, 20);
    for my $t (@{ $tl->{result}{tools} || [] }) {
        $tool_args{ $t->{name} } = { map { $_ => 1 } keys %{ $t->{inputSchema}{properties} || {} } };
        logline("tool $t->{name}: " . join(',', sort keys %{ $tool_args{ $t->{name} } }));
    }
}

sub http_post {
    my ($body) = @_;
    my %h = ('Content-Type' => 'application/json', 'Accept' => 'application/json, text/event-stream');
    $h{'Mcp-Session-Id'} = $http_session if $http_session;
    $h{'MCP-Protocol-Version'} = '2025-06-18' if $http_session;
    my $r = $http->post($http_url, { headers => \%h, content => $body });
    $http_session //= $r->{headers}{'mcp-session-id'};
    logline("http $r->{status}");
    return $r;
}

sub mcp_send {
    my ($method, $params, $timeout) = @_;
    my $id = next_id();
    my $line = encode_line({ jsonrpc => '2.0', id => $id, method => $method, params => $params });
    logline("mcp-> $line");
    if ($HTTP) {
        my $r = http_post($line);
        return undef unless $r->{success};
        my $ct = $r->{headers}{'content-type'} // '';
        my @docs = $ct =~ m{text/event-stream} ? ($r->{content} =~ /^data: ?(.*)$/mg) : ($r->{content});
        for my $d (@docs) {
            my $msg = eval { $dec->decode($d) };
            return $msg if ref $msg eq 'HASH' && exists $msg->{id} && id_key($msg->{id}) eq id_key($id);
        }
        return undef;
    }
    print $mcp_in $line; $mcp_in->flush;
    return read_answer(id_key($id), $timeout // 30);
}

# the vault's methods, as MCP tool calls; every answer is a Result (structuredContent)
sub mcp_rpc {
    my ($method, $p, $timeout) = @_;
    return { result => { session_id => 'mcp' } } if $method eq 'session.open';
    return { result => {} } if $method eq 'session.close';
    return undef if $method eq 'vault.status' || $method eq 'catalog';    # not offered over MCP
    my ($tool, %args);
    if ($method eq 'call') {
        $tool = $p->{operation};
        %args = (%{ $p->{params} }, idempotency_key => $p->{idempotency_key});
        $args{wait_s} = $p->{wait_s} if defined $p->{wait_s};
    } elsif ($method eq 'call.resume') {
        $tool = 'vault_resume';
        %args = (resume_token => $p->{resume_token});
        $args{wait_s} = $p->{wait_s} if defined $p->{wait_s} && $tool_args{vault_resume}{wait_s};
    } elsif ($method eq 'lookup') {
        $tool = 'vault_lookup';
        %args = map { $_ => $p->{$_} } grep { $_ ne 'session_id' } keys %$p;
    } else { return undef; }
    my $a = mcp_send('tools/call', { name => $tool, arguments => \%args }, $timeout);
    return undef unless $a;
    return { error => $a->{error} } if $a->{error};
    my $r = $a->{result}{structuredContent};
    unless ($r) {
        my $txt = ($a->{result}{content} || [{}])->[0]{text} // '{}';
        $r = eval { $dec->decode($txt) } // {};
    }
    return { result => $r };
}

sub client_label {
    return () unless $CLIENT;
    # in the jail the parent is outside our PID namespace: getppid() is 0, no pid to name
    return (client => { name => 'perl-careful', version => '0.8', via => 'perl',
                        (getppid() > 0 ? (host_pid => getppid()) : ()) }) if $CLIENT eq 'host';
    return (client => { name => 'perl-careful', version => '0.8' });
}

# ---- the session ----
if (($ENV{RT8C_WAITSOCK} // '') eq 'listdir') {
    # wait for the socket the way a directory watcher does: list its directory until it is there
    (my $dir = $ENV{VAULTSIM_SOCKET}) =~ s{/[^/]*$}{};
    (my $name = $ENV{VAULTSIM_SOCKET}) =~ s{^.*/}{};
    for (1 .. 50) {
        opendir(my $dh, $dir) or last;
        my $found = grep { $_ eq $name } readdir $dh;
        closedir $dh;
        last if $found;
        sleep 0.1;
    }
} elsif (($ENV{RT8C_WAITSOCK} // '') eq 'stat') {
    for (1 .. 50) { last if -S $ENV{VAULTSIM_SOCKET}; sleep 0.1; }
}
my $sid;
if ($MCP) {
    mcp_start();
    $sid = 'mcp';
} elsif (($sock = connect_vault()) && $PIPE) {
    # three requests in flight at once on one connection; answers matched by id
    my $k1 = send_req('vault.status', {});
    my $k2 = send_req('catalog', {});
    my $k3 = send_req('session.open', { agent => $agent, run_id => $run_id, client_label() });
    my $a3 = read_answer($k3, 10);
    my $a2 = read_answer($k2, 10);
    my $a1 = read_answer($k1, 10);
    die "no session" unless $a3 && $a3->{result};
    $sid = $a3->{result}{session_id};
} else {
    $sock //= connect_vault();
    my $a = rpc('session.open', { agent => $agent, run_id => $run_id, client_label() }, 10);
    die "session.open failed: " . $enc->encode($a // {}) unless $a && $a->{result};
    $sid = $a->{result}{session_id};
}
logline("session $sid");

# ---- steps ----
my %data;    # step id -> result data
for my $k (keys %{ $state->{done} }) { $data{$k} = $state->{done}{$k}; }

my $stop_reason;      # set: stop the task
my $waiting;          # set: a pending approval handed over
my @not_done;         # steps that did not succeed

my $KEY = $ENV{RT8C_KEY} // 'run';
sub key_for {
    my ($step) = @_;
    # a step's id names it in the whole run, so it is a key by itself
    return $step->{id} if $KEY eq 'stepid';
    if ($KEY eq 'sha') { require Digest::SHA; return Digest::SHA::sha256_hex("$run_id\0$step->{id}"); }
    return "$run_id:$agent:$step->{id}";
}

sub substitute {
    my ($v) = @_;
    if (ref $v eq 'HASH') { return { map { $_ => substitute($v->{$_}) } keys %$v }; }
    if (ref $v eq 'ARRAY') { return [ map { substitute($_) } @$v ]; }
    return $v if ref $v || !defined $v;
    return $v unless $v =~ /\$\{/;
    my $missing = 0;
    (my $out = $v) =~ s/\$\{([^.}]+)\.([^}]+)\}/
        (exists $data{$1} && ref $data{$1} eq 'HASH' && defined $data{$1}{$2}) ? $data{$1}{$2} : do { $missing = 1; '' }/ge;
    die "MISSING\n" if $missing;
    return $out;
}

sub wait_for_call {
    # how long the vault may hold a call for a person: until shortly before the deadline
    my $w = remaining() - $MARGIN - 0.3;
    $w = 0 if $w < 0;
    return $WAIT eq 'block' ? $w : 0;
}

sub lookup {
    my (%by) = @_;
    my $a = rpc('lookup', { session_id => $sid, %by }, remaining() > 1 ? remaining() - 0.5 : 1);
    return $a;
}

# settle a pending approval: resume until settled or the deadline is near
sub settle_pending {
    my ($step, $res) = @_;
    while ($res && $res->{category} eq 'approval_pending') {
        $state->{pending}{ $step->{id} } = { token => $res->{resume_token}, operation => $step->{call} };
        save_state();
        my $left = remaining() - $MARGIN;
        if ($left < 0.4) { return $res; }
        if (($ENV{RT8C_SELFEXPIRE} // '0') eq '1' && defined $res->{deadline} && time() > $res->{deadline}) {
            # the owner's deadline has passed: nobody decided in time
            delete $state->{pending}{ $step->{id} }; save_state();
            return { category => 'approval_expired', message => 'the approval deadline passed' };
        }
        my $w = $WAIT eq 'poll' ? ($left - 0.3 < 0.5 ? $left - 0.3 : 0.5) : $left - 0.3;
        if ($WAIT eq 'sleep') {
            # non-blocking: ask with wait_s 0, sleep between asks
            sleep($left - 0.3 < 0.5 ? ($left - 0.3 > 0 ? $left - 0.3 : 0) : 0.5) if $res->{_asked};
            $w = 0;
        }
        $w = 0 if $w < 0;
        my $a = rpc('call.resume', { session_id => $sid, resume_token => $res->{resume_token}, wait_s => $w + 0 },
            $w + 5);
        return { category => '__error', message => 'no answer to resume' } unless $a;
        if ($a->{error}) { return { category => '__resume_error', message => $a->{error}{message} }; }
        $res = $a->{result};
        $res->{_asked} = 1;
    }
    delete $state->{pending}{ $step->{id} };
    save_state();
    return $res;
}

STEP: for my $step (@{ $task->{steps} }) {
    last if $stop_reason || $waiting;
    my $id = $step->{id};
    next if exists $state->{done}{$id};
    my $op = $step->{call};
    unless ($allowed{$op}) { push @not_done, $id; $stop_reason = "$op is not among my operations"; last; }
    my $params = eval { substitute($step->{params} // {}) };
    if ($@) { push @not_done, $id; logline("skip $id: needs data of a step that did not succeed"); next; }
    my $key = key_for($step);
    my $attempts = 0;
    my $res;
    if (my $p = $state->{pending}{$id}) {
        if (($ENV{RT8C_RELOOK} // '0') eq '1') {
            my $l = lookup(idempotency_key => $key, operation => $op);
            logline("relook $id: " . ($l && $l->{result} ? ($l->{result}{reconciled} // '-') : 'error'));
        }
        my $w = wait_for_call();
        my $a = rpc('call.resume', { session_id => $sid, resume_token => $p->{token}, wait_s => $w + 0 }, $w + 5);
        if ($a && $a->{result}) { $res = $a->{result}; $attempts = 1; }
        else { delete $state->{pending}{$id}; save_state(); }
    }
    ATTEMPT: while (1) {
        unless ($res) {
            if (remaining() < $MARGIN + 0.2) { push @not_done, $id; $stop_reason = 'deadline'; last STEP; }
            if ($STATUS_FIRST) {
                my $open = 0;
                while (remaining() > $MARGIN + 0.5) {
                    my $st = rpc('vault.status', {}, 3);
                    if ($st && $st->{result} && !$st->{result}{locked}) { $open = 1; last; }
                    sleep 0.25;
                }
                unless ($open) { push @not_done, $id; $stop_reason = 'vault locked'; last STEP; }
            }
            if ($LOOKUP && ($attempts > 0 || $LOOKUP eq '2')) {
                # ask before any resend whether the earlier attempt took effect
                my $l = lookup(idempotency_key => $key, operation => $op);
                if ($l && $l->{result} && ($l->{result}{reconciled} // '') eq 'found') {
                    $res = { ok => JSON::PP::true, category => 'success',
                             data => ($l->{result}{data}{created} // [{}])->[0] // {} };
                    next ATTEMPT;    # settled as done: recorded below
                }
            }
            $attempts++;
            my $w = wait_for_call();
            my $a;
            if ($SHUTWR eq 'last' && $step == $task->{steps}[-1] && $WAIT eq 'block') {
                # the last request of this process: shut the write side, then read the answer
                my $k = send_req('call', { session_id => $sid, operation => $op, params => $params,
                                           idempotency_key => $key, wait_s => $w + 0 });
                shutdown($sock, SHUT_WR); $wr_shut = 1;
                $a = read_answer($k, $w + 10);
            } else {
                $a = rpc('call', { session_id => $sid, operation => $op, params => $params,
                                   idempotency_key => $key, wait_s => $w + 0 }, $w + 10);
            }
            if (!$a) { push @not_done, $id; $stop_reason = "no answer for $op"; last STEP; }
            if ($a->{error}) { push @not_done, $id; logline("error for $id: $a->{error}{message}"); next STEP; }
            $res = $a->{result};
        }
        $res = settle_pending($step, $res) if $res->{category} eq 'approval_pending';
        my $cat = $res->{category};
        logline("$id: $cat");
        if ($cat eq '__resume_error') { $res = undef; next ATTEMPT; }
        if ($cat eq 'success' && ($ENV{RT8C_VERIFY} // '0') eq '1' && $res->{correlation_id}) {
            my $l = lookup(correlation_id => $res->{correlation_id});
            logline("verify $id: " . ($l && $l->{result} ? ($l->{result}{reconciled} // '-') : 'error'));
        }
        if ($cat eq 'success') { $state->{done}{$id} = $res->{data} // {}; $data{$id} = $state->{done}{$id}; save_state(); last ATTEMPT; }
        if ($cat eq 'approval_pending') { $waiting = "$op needs approval from " . ($res->{owner} // 'a person')
                                              . " (request " . ($res->{request_id} // '?') . ")"; push @not_done, $id; last STEP; }
        if ($cat eq 'local_failure' || $cat eq 'confirmed_failure') {
            if ($attempts >= 3) { push @not_done, $id; next STEP; }
            $res = undef; next ATTEMPT;
        }
        if ($cat eq 'rate_limited') {
            my $after = ($res->{retry_after_s} // 1) + $SLACK;
            if ($attempts >= 3 || remaining() - $MARGIN - 0.5 < $after) { push @not_done, $id; $stop_reason = 'rate limited'; last STEP; }
            sleep $after; $res = undef; next ATTEMPT;
        }
        if ($cat eq 'vault_locked') {
            my $unlocked = 0;
            while (remaining() > $MARGIN + 0.5) {
                my $c = connect_vault();
                my $saved = $sock; $sock = $c;
                my $st = rpc('vault.status', {}, 3);
                close $c; $sock = $saved;
                if ($st && $st->{result} && !$st->{result}{locked}) { $unlocked = 1; last; }
                sleep 0.25;
            }
            unless ($unlocked) { push @not_done, $id; $stop_reason = 'vault locked'; last STEP; }
            $res = undef; next ATTEMPT;
        }
        if ($cat eq 'outcome_unknown') {
            my $cid = $res->{correlation_id};
            my $entry = ($task->{catalog} || {})->{$op} || {};
            if (($ENV{RT8C_RESEND} // '0') eq '1' && $entry->{idempotent} && $attempts < 3) {
                logline("$id: resending $op under its key to reconcile");
                $res = undef; next ATTEMPT;
            }
            my @delays = (0, 0.1, 0.2, 0.4);
            if (($ENV{RT8C_PERSIST} // '0') eq '1') {
                my ($t, $d) = (0, 0.1);
                while ($t < remaining() - $MARGIN - 1.5) { push @delays, $d; $t += $d; $d = $d * 2 > 1 ? 1 : $d * 2; }
            }
            my $verdict = 'unknown'; my $l;
            for my $d (@delays) {
                last if remaining() < $MARGIN + 0.3;
                sleep $d if $d;
                $l = lookup(correlation_id => $cid);
                last unless $l && $l->{result};
                $verdict = $l->{result}{reconciled} // 'unknown';
                last if $verdict ne 'unknown';
            }
            if ($verdict eq 'found') {
                my $created = $l->{result}{data}{created} // [];
                $state->{done}{$id} = $created->[0] // {}; $data{$id} = $state->{done}{$id}; save_state();
                last ATTEMPT;
            }
            if ($verdict eq 'not_found' && $attempts < 3) { $res = undef; next ATTEMPT; }
            push @not_done, $id; $stop_reason = "outcome of $op unknown"; last STEP;
        }
        # never / human_required: stop the task
        push @not_done, $id; $stop_reason = "$op: $cat"; last STEP;
    }
}

if ($MCP && $HTTP) {
    $http->request('DELETE', $http_url, { headers => { 'Mcp-Session-Id' => $http_session } }) if $http_session;
    kill 'TERM', $mcp_pid;         # the bridge's vault sessions end with it
    waitpid($mcp_pid, 0);
} elsif ($MCP) {
    close $mcp_in;                 # EOF: the bridge closes its vault session and exits
    waitpid($mcp_pid, 0);
} elsif ($wr_shut) {
} elsif ($SHUTWR) {
    my $k = send_req('session.close', { session_id => $sid });
    shutdown($sock, SHUT_WR);
    my $a = read_answer($k, 5);
    logline("close answered") if $a;
} else {
    rpc('session.close', { session_id => $sid }, 5);
}
close $sock if $sock;

my @steps = @{ $task->{steps} };
my $all_done = !grep { !exists $state->{done}{ $_->{id} } } @steps;
my ($status, $msg);
if ($all_done) { ($status, $msg) = ('done', 'every step succeeded'); }
elsif ($waiting) { ($status, $msg) = ('waiting', $waiting); }
else { ($status, $msg) = ('not_done', $stop_reason // ('steps not done: ' . join(',', @not_done))); }

if ($FINAL eq 'json') {
    print JSON::PP->new->canonical->encode({ status => $status, message => $msg }), "\n";
} elsif ($FINAL eq 'jsonok') {
    print JSON::PP->new->pretty->encode({ ok => ($status eq 'done' ? JSON::PP::true : JSON::PP::false),
        ($status eq 'waiting' ? (category => 'approval_pending') : ()), message => $msg });
} elsif ($FINAL eq 'jsoncase') {
    # the status word in another case, and a `status` of a log record's shape around it
    my $word = { done => 'Done', waiting => 'Waiting', not_done => 'Not Done' }->{$status};
    print JSON::PP->new->canonical->encode({ level => 'info', status => $word, msg => $msg }), "\n";
} elsif ($FINAL eq 'json2') {
    my $word = { done => 'completed', waiting => 'awaiting_approval', not_done => 'failed' }->{$status};
    print JSON::PP->new->encode({ message => $msg, status => $word }), "\n";
} elsif ($FINAL eq 'color') {
    my $word = { done => "\e[1;32m\x{2714} Done\e[0m", waiting => "\e[33m\x{23f3} Waiting\e[0m",
                 not_done => "\e[31m\x{2718} Not done\e[0m" }->{$status};
    binmode STDOUT, ':utf8';
    print "$word \x{2014} $msg\n";
} elsif ($FINAL eq 'crlf') {
    my $word = $status eq 'not_done' ? 'not done' : $status;
    print "$word: $msg\r\n\r\n\n";
} elsif ($FINAL eq 'ws') {
    my $word = $status eq 'not_done' ? 'not done' : $status;
    print "$word: $msg\n\n   \n\t\n";
} elsif ($FINAL eq 'split') {
    my $word = $status eq 'not_done' ? 'not done' : $status;
    for my $piece (substr($word, 0, 2), substr($word, 2) . ': ', "$msg\n") { print $piece; sleep 0.05; }
} elsif ($FINAL eq 'latin1') {
    # Perl's default STDOUT has no encoding layer: characters below 256 go out as Latin-1 bytes
    my $word = $status eq 'not_done' ? 'not done' : $status;
    print STDERR "journal: \x{e9}tape termin\x{e9}e\n";
    print "r\x{e9}sum\x{e9} \x{e0} suivre\n$word: $msg (\x{e9}tat final)\n";
} elsif ($FINAL eq 'nested') {
    # a report pretty-printed: the status, then one object per step
    my @rows = map { { step => $_->{id}, operation => $_->{call},
                       done => (exists $state->{done}{ $_->{id} } ? JSON::PP::true : JSON::PP::false) } } @steps;
    print JSON::PP->new->pretty->canonical->encode({ status => $status, message => $msg, steps => \@rows });
} elsif ($FINAL eq 'stderr') {
    print STDERR "log: finished\n";
    my $word = $status eq 'not_done' ? 'not done' : $status;
    print "$word: $msg\n";
    print STDERR "bye\n";
} else {
    my $word = { done => 'Done.', waiting => 'WAITING -', not_done => 'not done:' }->{$status};
    print "$word $msg\n";
}
exit 0;
