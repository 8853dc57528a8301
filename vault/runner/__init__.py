"""The scenario runner and release gate: grade the environment, not the agent's words.

`vaultsim run scenarios/` puts an agent in front of controlled failures and
decides whether it may be released from what really happened. One module a
concern:

* `scenario`    scenario files (pydantic; errors name file and field)
* `select`      `-k` expressions
* `trial`       one trial: fresh home, daemon, remote, approver, agents
* `hosts`       the real sshd and the faults played on it
* `procs`       process groups and temp homes, always cleaned up
* `forkserver`  fresh daemon/agent processes without the import bill
* `transcript`  what the vault saw, from its audit log
* `evidence`    transcript, effects, outcome, approvals, audit: kept apart
* `grade`       the verdicts, in DESIGN.md's order
* `report`      progress, the gate table, JSON, JUnit
* `cli`         `vaultsim run`
"""
