"""Requests in progress, bounded per process, per process tree and in all.

Each request the daemon works on holds a task until it is answered, and some
answers take as long as the client asks (`call.resume` with `wait_s` of a
day). The cap of 64 per connection alone let one process with 256 connections
hold 16,384 of them, and a few processes every one the daemon could hold
(hundreds of MB). Counted on the process that opened the connection, as
connections are (vault.daemon.limits).
"""

from __future__ import annotations

from vault.daemon.limits import MAX_IN_FLIGHT_PER_PROCESS, MAX_IN_FLIGHT_PER_TREE, MAX_IN_FLIGHT_TOTAL
from vault.daemon.processes import ProcessEntry, ProcessTable


def begin(table: ProcessTable, entry: ProcessEntry, in_all: bool = True) -> str | None:
    """Count one more request of `entry`'s; None if granted, else why not (nothing counted).
    `in_all` False (the approver socket): not held to the total, so agents filling it never
    keep the person from deciding, locking or stopping the vault."""
    tree = table.tree_of(entry)
    if entry.in_flight >= MAX_IN_FLIGHT_PER_PROCESS:
        return (f"too many requests in progress from this process (at most {MAX_IN_FLIGHT_PER_PROCESS} "
                "across its connections); wait for an answer, then send again. Nothing was done")
    if table.tree_in_flight.get(tree, 0) >= MAX_IN_FLIGHT_PER_TREE:
        return (f"too many requests in progress from this process and the others of its process tree "
                f"(at most {MAX_IN_FLIGHT_PER_TREE}); wait for an answer, then send again. Nothing was done")
    if in_all and table.in_flight >= MAX_IN_FLIGHT_TOTAL:
        return ("too many requests in progress from all clients; wait for an answer, then send again. "
                "Nothing was done")
    entry.in_flight += 1
    table.in_flight += 1
    table.tree_in_flight[tree] = table.tree_in_flight.get(tree, 0) + 1
    return None


def end(table: ProcessTable, entry: ProcessEntry) -> None:
    """One request of `entry`'s answered (or dropped)."""
    tree = table.tree_of(entry)
    entry.in_flight -= 1
    table.in_flight -= 1
    left = table.tree_in_flight.get(tree, 0) - 1
    if left > 0:
        table.tree_in_flight[tree] = left
    else:
        table.tree_in_flight.pop(tree, None)
