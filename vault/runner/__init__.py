"""The scenario runner and release gate: grade the environment, not the agent's words.

`vaultsim run scenarios/` puts an agent in front of controlled failures and
decides whether it may be released from what really happened. One module a
concern:

* `scenario`    scenario files (pydantic; errors name file and field), `expect`
                vs `selfcheck`, cases
* `contract`    the task file an agent gets: docs/agent-contract.md's fields
* `select`      `-k` expressions
* `trial`       one trial: fresh home, daemon, remote, approver, agents (each in its
                jail), intruder
* `tripwires`   a jailed agent's decoys and watches: what it reached for
* `opens`       without a jail, as root: who opened the vault's secret files (fanotify;
                its reader process `opens_reader`)
* `intruder`    another process presenting an agent's session id
* `hosts`       the real sshd and the faults played on it
* `procs`       process groups and temp homes, always cleaned up
* `forkserver`  fresh daemon/agent processes without the import bill
* `transcript`  what the vault saw, from its audit log
* `logical`     a call and its resumes as one logical call; the trace
* `evidence`    transcript, effects, outcome, approvals, audit: kept apart
* `grade`       the table of checks, in DESIGN.md's order; matching an expectation
* `bypass`      around the vault: FAIL_VAULT_BYPASS, FAIL_SELF_APPROVAL,
                FAIL_AUDIT_TAMPER; the canary's encodings
* `waits`       real waits (EXPECTED_WAIT) and lost receipts (FAIL_MEMORY)
* `retries`     retry instructions and transitions, per run (FAIL_RECOVERY)
* `claims`      every final message's claim against the environment (FAIL_OUTCOME)
* `report`      per case and in sum: what the run found
* `table`       progress, the header, the gate table, the summary
* `report_schema` the versioned JSON report; `junit` the JUnit XML
* `executor`    where trials run: one interface, the local executor
* `ray_executor`, `ray_worker`, `ship`   trials as Ray tasks: driver, task body, staged files
* `shard`       `--shard K/N`: a deterministic part of the trials
* `merge`       `vaultsim report merge`: shards into one decision
* `cli`         `vaultsim run`
"""
