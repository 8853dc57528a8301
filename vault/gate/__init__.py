"""The gate: lock state, policy, grants, pending approvals and prompt statistics.

Everything here lives in daemon memory only. `engine.Gate` is the one entry
point the daemon calls; the other modules are its parts. Nothing here knows
the wire: the gate records, tells approvers and asks whether one can be reached
through callables it is given, and refuses with domain errors (vault.errors)
that the JSON-RPC layer maps to codes (tests/test_seams.py holds this).
"""
