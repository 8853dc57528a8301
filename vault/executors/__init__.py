"""Executors perform an operation against a remote on the agent's behalf.

One small base class (`Executor`), one module per transport. An executor gets
the operation, validated parameters, the credential in its `Secret` wrapper and
a `CallContext`; it returns an `ExecOutcome`: the agent-facing Result plus the
raw evidence that goes only to protected diagnostics.
"""
