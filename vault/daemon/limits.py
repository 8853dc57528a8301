"""Every bound the daemon puts on what clients can make it hold, in one table.

One client must never slow, grow or stop the daemon for another, so each
resource a client can make the daemon keep is bounded three ways: per
connection, per process (a process can open many connections and sessions),
and in all. Past a bound the request is answered -32004 (or, for prompts,
`rate_limited`) with nothing done; a connection that holds memory past a
bound is closed with an error line.

    resource                          per connection    per process     in all
    one JSON-RPC line                 1 MiB (MAX_FRAME in jsonrpc)
    requests in progress              64                1,024           32,768 (a process tree: 4,096)
    unsent bytes (answers, notices)   4 MiB, reading paused past 256 KiB
    connections (both sockets)                          256             8,192 (and the fd limit),
                                      per process tree: 1,024 (at most a quarter of the slots)
                                                                        the last 64 (at most a quarter)
                                                                        for the approver socket
    bytes of unfinished lines                           4 MiB           32 MiB
    open agent sessions               256               256             16,384
    prompts waiting for a person      32 per session    64              4,096
    approver subscriber backlog       1 MiB, or 10 s without progress: disconnected
                                                                        64 MiB: those with
                                                                        a backlog disconnected
    one answer page                   256 KiB or 500 items
    audit records of refused or                         the first 8-32,
      unknown requests, connects                        then powers of two
    lookups only the remote can answer                  per agent and run: 16 at once,
      (a key or id the daemon does not remember)        then 4 a second (`rate_limited`)

A process tree is a client process with every process it started, as the daemon finds it at
accept time: the ancestor just below the nearest one it shares with the daemon (the agent's jail
keeper, which re-parents orphans to itself, in a runner's trial). One agent forking many
processes therefore cannot take every connection slot from the other agents of its run.

The per-process bounds are keyed by the process (pid + start time) that
opened the connection, or that sent the frame.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB

# ---- per connection ------------------------------------------------------------
MAX_IN_FLIGHT = 64  # requests in progress on one connection
MAX_OUTBOUND_BYTES = 4 * MiB  # unsent bytes on one connection: past it, it is closed
OUTBOUND_PAUSE_BYTES = 256 * KiB  # unsent bytes past which the connection is not read
MAX_SESSIONS_PER_CONNECTION = 256

# ---- per process ---------------------------------------------------------------
MAX_CONNECTIONS_PER_PROCESS = 256  # both sockets together
MAX_PARTIAL_BYTES_PER_PROCESS = 4 * MiB  # unfinished lines across its connections
MAX_SESSIONS_PER_PROCESS = 256
MAX_PENDING_PER_PROCESS = 64  # prompts waiting for a person, across its sessions
MAX_PENDING_PER_SESSION = 32
# each request in progress holds a task (~5 KB): 64 per connection alone let 8,192 connections
# hold half a million of them (~3 GB); a call.resume waiting a day is one
MAX_IN_FLIGHT_PER_PROCESS = 1024

# ---- per process tree (a client with the processes it started: vault.daemon.processes) -----
MAX_CONNECTIONS_PER_TREE = 1024  # and at most a quarter of the slots when the fd limit lowers them
MAX_IN_FLIGHT_PER_TREE = 4096  # an eighth of all: one client forking cannot take every request slot

# ---- in all --------------------------------------------------------------------
MAX_CONNECTIONS = 8192  # lowered at start to what the open-file limit allows
# kept free of agent connections: agents holding every other one never lock out the person
# (or `vaultsim lock` / `stop`) on the approver socket
APPROVER_RESERVE = 64
MAX_PARTIAL_BYTES = 32 * MiB
MAX_SESSIONS = 16_384
MAX_PENDING = 4096
MAX_IN_FLIGHT_TOTAL = 32_768  # requests in progress from every client (~170 MB of tasks at most)

# ---- approver subscribers ------------------------------------------------------
MAX_SUBSCRIBER_BACKLOG = 1 * MiB  # unsent notifications: past it the subscriber is dropped
# of all subscribers together: past it, each subscriber that has a backlog is dropped
MAX_SUBSCRIBERS_BACKLOG = 64 * MiB
SUBSCRIBER_STALL_S = 10.0  # a backlog that has not moved for this long: dropped

# ---- answers that list things --------------------------------------------------
PAGE_BYTES = 256 * KiB
PAGE_ITEMS = 500

# a prompt refused for a cap: when to try again
TOO_MANY_PENDING_RETRY_S = 5.0


# ---- audit records of what a client can repeat for free -------------------------
PROCESSES_COUNTED = 4096  # processes whose refusals are counted; past it the count starts again


class PerProcessCount:
    """How many of something each process did, to record a flood's first few and then only its
    powers of two (refusals need no token, and each audit record costs the log ~500 bytes: one
    record per request grew it by megabytes a second toward a full disk). Counted per process,
    not per connection, so reconnecting does not start the count again."""

    def __init__(self) -> None:
        self._counts: dict[tuple[int, float], int] = {}

    def add(self, key: tuple[int, float]) -> int:
        """One more for process `key` (pid, start time); its number."""
        if key not in self._counts and len(self._counts) >= PROCESSES_COUNTED:
            self._counts.clear()
        n = self._counts[key] = self._counts.get(key, 0) + 1
        return n


# lookups the daemon cannot answer from memory (a key it never saw, a call from before a restart):
# each asks the remote. A restarted agent looks each step up a few times; a loop is a flood.
REMOTE_LOOKUPS_AT_ONCE = 16
REMOTE_LOOKUPS_PER_S = 4.0
PACED_KEYS = 4096  # agents (run, name) whose pace is kept (the oldest forgotten first)


class Paced:
    """A token bucket per key: `at_once` in a burst, then `per_s` a second."""

    def __init__(self, at_once: int, per_s: float) -> None:
        self.at_once, self.per_s = at_once, per_s
        self._buckets: dict[object, tuple[float, float]] = {}  # key -> (tokens, when counted)

    def wait(self, key: object, now: float) -> float:
        """Take one for `key`: 0 when taken, else the seconds until one is free (nothing taken)."""
        tokens, then = self._buckets.pop(key, (float(self.at_once), now))
        tokens = min(float(self.at_once), tokens + max(0.0, now - then) * self.per_s)
        taken = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if taken else tokens, now)  # re-inserted: the newest last
        if len(self._buckets) > PACED_KEYS:
            del self._buckets[next(iter(self._buckets))]
        return 0.0 if taken else (1.0 - tokens) / self.per_s


def sampled(n: int, first: int) -> bool:
    """Whether the n-th of a process's repeats is recorded: the first `first`, then powers of two."""
    return n <= first or not n & (n - 1)
