"""The gate: lock state, policy, grants, pending approvals and prompt statistics.

Everything here lives in daemon memory only. `engine.Gate` is the one entry
point the daemon calls; the other modules are its parts.
"""
