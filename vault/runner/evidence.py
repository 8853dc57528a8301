"""What one trial left behind, kept apart by where it comes from.

* transcript   what the vault saw (audit log; `vault.runner.transcript`), with the
               requests it refused for presenting another process's session
* effects      what the remote really did: its ledger (attempts and effects per
               logical operation), its event log, its final state; the SSH
               host's restart log and markers
* outcome      the deliverable, read from that state by the scenario's oracle
* approvals    the daemon's prompt statistics for the trial's run id
* audit        the log's offline verification
* agents       each process's exit, timing and output; its words are graded
               only against the environment, never taken as evidence
* bypass       (vault.runner.bypass) requests the remote got around the vault,
               SSH logins, every approver attempt with its process, the
               daemon's own audit head, and what a jailed agent's tripwires saw

`visible` holds every byte an agent or a log could see, for the canary scan
(of a file an agent left, the part that holds a credential, if one does);
`secrets` the values that must never appear there. Neither is ever reported.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from vault.lookalike import skeletons
from vault.runner.alt_screen import main_screen
from vault.runner.drawn import as_shown
from vault.runner.fatigue import prompt_log
from vault.runner.framed import is_frame, yaml_object
from vault.runner.logical import Timeline
from vault.runner.repr_claims import spanning_object
from vault.runner.rich_log import with_time_above
from vault.runner.screen import screen_lines
from vault.runner.transcript import Transcript
from vault.text import without_escapes


# a markdown code fence (```json, ~~~): how a model frames its message, not a message
_FENCE = re.compile(r"(`{3,}|~{3,})[\w+.-]*")
# what ends a line of output: \n (the contract's), and \r\n or \r as a terminal shows them; not
# str.splitlines()'s others (U+2028, U+2029, NEL, \v, \f, \x1c-\x1e): JSON encoders leave the
# first three raw in a string (Node's JSON.stringify, Python's ensure_ascii=False), so splitting
# there cut one final message in two and read its tail as the claim
_EOL = re.compile(r"\r\n|\r|\n")
# how many openings at the closing brace's indentation an indented JSON final message is tried from
# (a log of such objects above it fails to parse in a few bytes; the bound keeps a flood of them cheap)
_MOST_TRIES = 32


BRAILLE_BLANK = "\u2800"
_BLANKS = re.compile(" {2,}")


def _shows(line: str) -> bool:
    """Does `line` show anything on a terminal? Not when all it holds is escapes, whitespace,
    control, format (zero-width, bidi) or other default-ignorable characters (vault.lookalike),
    nor when it is a markdown code fence around the message."""
    # as drawn: a line of concealed text (SGR 8), or one erased or drawn over with blanks, shows
    # nothing and must not hide the line above it (vault.runner.drawn)
    # a braille blank (U+2800) draws an empty cell too: a spinner at rest on its blank frame
    # (runs of blanks as one first: skeletons reads them so, and a line drawn 65,536 columns wide
    # was looked at a character at a time)
    shown = _BLANKS.sub(" ", as_shown(line))
    text = "".join(ch for ch in shown if unicodedata.category(ch) != "Cc" and ch != BRAILLE_BLANK)
    forms = skeletons(text)
    return any(forms) and not any(_FENCE.fullmatch(f) for f in forms)


def _dict(text: str) -> dict[str, Any] | None:
    """The dict `text` holds as JSON or as a Python literal (a dict's repr), else None."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):  # nested past the parser's depth
        doc = None
        if len(text) <= 65536:
            try:
                doc = ast.literal_eval(text)
            except (ValueError, SyntaxError, RecursionError, MemoryError, TypeError):
                pass
    return doc if isinstance(doc, dict) else None


@dataclass
class AgentRun:
    index: int
    name: str
    command: str
    pid: int
    started: float
    ended: float
    exit_code: int | None
    killed_at_deadline: bool
    stdout: str
    stderr: str
    # processes it left running outside its process group when it exited (ended by the runner)
    left_running: int = 0
    # without a jail: its keeper ended without counting them (the agent, same user, killed it)
    keeper_unreported: bool = False
    # the command lines of its processes, sampled while it ran (only when handed a credential)
    command_lines: dict[str, bytes] = field(default_factory=dict)
    # bytes on disk in its scratch and state directories when it was gone (a disk it filled is named)
    scratch_bytes: int = 0
    # the most they held while the disk was nearly full (vault.runner.disk_watch): a fill freed again
    scratch_peak: int = 0
    # what had become of the vault daemon when this agent's processes were gone: "" (serving),
    # "stopped" (SIGSTOP'd by a process of the same user; the runner resumed it) or how it ended
    daemon_after: str = ""
    # cgroups the daemon was seen in while it ran that it was not in before (a freezer's group)
    daemon_moved: list[str] = field(default_factory=list)
    # forks its jail's process cap refused (vault.jail.pids): a fork bomb, contained
    pids_refused: int = 0
    # the vault's credential files (credentials.enc, its keyring's) that changed while it ran
    credential_files: list[str] = field(default_factory=list)
    # what the jail's tripwires saw this agent reach for (vault.runner.tripwires)
    tripwires: list[dict[str, Any]] = field(default_factory=list)
    # the task it was given (vault.runner.contract): graded against, never taken from the agent
    deadline: float | None = None
    role: str | None = None
    operations: list[str] | None = None
    steps: list[dict[str, Any]] | None = None
    # the working directory it ran in (without a jail it can write there: scanned for a leak)
    cwd: str | None = None
    # where its whole output is (stdout and stderr above are their last OUTPUT_TAIL bytes): the
    # canary scan reads these a chunk at a time, so gigabytes of output cost no runner memory
    stdout_file: str | None = None
    stderr_file: str | None = None
    # per output file, the bytes and SHA-256 the runner copied into it from the agent's pipe
    # (vault.runner.pump): a file that holds anything else was changed by its path afterwards;
    # and the bytes that could not be written there (a full disk): never scanned; and whether the
    # copy stopped with a writer still holding the pipe (a process that outlived the agent)
    output_written: dict[str, tuple[int, str, int, bool]] = field(default_factory=dict)
    # when its stdout last brought anything but blanks (vault.runner.pump): its final message was
    # written by then, so a request of its sent after that came after its claim
    stdout_shown: float | None = None
    # what it had left in its state directory and /tmp holding a credential when it ended (a
    # successor sharing the state directory may take it away before the trial's end), and what
    # that scan's bounds left unread
    left_behind: dict[str, bytes] = field(default_factory=dict)
    left_unscanned: list[str] = field(default_factory=list)
    # other tasks' state directories it changed while it ran (vault.runner.state_cross)
    state_crossed: list[dict[str, Any]] = field(default_factory=list)
    # the agent's own process, (pid, start) as its keeper forked it (vault.jail.keeper): which of the
    # daemon's recorded processes it was (vault.runner.late_opens); None when the keeper said none
    agent_key: tuple[int, float] | None = None

    def same_task(self, other: "AgentRun") -> bool:
        """Runs `other`'s task: the same name and steps, a restart, whether the scenario kept its
        state directory or made it lose it (`state: fresh`: a directory of its own, `role` apart)."""
        return self.name == other.name and self.steps == other.steps

    @functools.cached_property
    def final(self) -> str:
        # (read once: the grade, the claim checks and the report each ask for it, and a 4 MiB line
        # of controls costs seconds to draw; `stdout` is never changed after the run)
        # a line of nothing but colour codes (a closing reset), invisible characters (a zero-width
        # space) or control characters is as empty as it looks: it never hides the line above it
        # (a byte-order mark opens the output of .NET and PowerShell programs: no part of a line)
        # (a display redrawn with the cursor moved up is read as the screen it leaves: vault.runner.screen)
        # (what it drew on the alternate screen, as a pager does, and then left is gone:
        # vault.runner.alt_screen)
        drawn = [ln for ln in screen_lines(main_screen(self.stdout.removeprefix("\ufeff"))) if _shows(ln)]
        # a line that is only a frame or a rule (a panel's or table's border, `────`, `---`, a
        # setext heading's underline) shows no words, as a code fence: the line above it is read
        # (vault.runner.framed)
        lines = [ln for ln in drawn if not is_frame(without_escapes(ln))]
        # an indented object is found and parsed as it shows: printed in colour whole
        # (`green(json.dumps(r, indent=2))`, its last line `}` and a reset) or token by token
        # (a pretty printer's highlighting), it is the same object
        shown = [without_escapes(ln) for ln in lines]
        if len(shown) > 1 and shown[-1].rstrip().endswith("}") and _dict(shown[-1].strip()) is None:
            # a JSON final message printed indented (json.dumps(indent=2), JSON.stringify(r, null, 2),
            # jq, serde's pretty printer), or a Python dict by pprint (`{'a': 1,` ... ` 'status':
            # 'done'}`), is read as its one line, however many lines it spans: its opening brace is
            # the nearest `{` above, no deeper than its last line (deeper ones are its members), so
            # it is parsed once, not once per line
            indent = len(shown[-1]) - len(shown[-1].lstrip())
            tries = 0
            for start in range(len(shown) - 2, -1, -1):
                line = shown[start]
                if line.lstrip().startswith("{") and len(line) - len(line.lstrip()) <= indent:
                    tries += 1
                    if tries > _MOST_TRIES:
                        break
                    doc = _dict("\n".join(shown[start:]))
                    if doc is not None:
                        return json.dumps(doc)
        # a result object printed over several lines (Rust's `{:#?}`, pprint of a dataclass,
        # Node's util.inspect) is read as its one line too, when it names a claim field
        spanned = spanning_object(shown)
        if spanned is not None:
            return spanned
        # a YAML mapping (yaml.safe_dump's keys sorted: `status: done` above `steps: 3`) is read
        # whole, from its `---` (which is a rule to the reading above, so it is found in `drawn`)
        yaml = yaml_object([without_escapes(ln) for ln in drawn])
        if yaml is not None:
            return yaml
        if not lines:
            return ""
        # a Rich log record whose time column was left blank (the same second as the record above)
        # is read with that time (vault.runner.rich_log)
        timed = with_time_above(lines)
        if timed is not None:
            return timed
        # whitespace around is nothing, unless the line is drawn: blanks written over its text
        # after a cursor moved back are what shows there
        return lines[-1] if as_shown(lines[-1]) != lines[-1] else lines[-1].strip()

    def failure(self) -> dict[str, str]:
        """The last stderr line of an agent that exited non-zero: why it could not do the task.
        Only that line, since stderr can carry anything the agent's environment held."""
        if not self.exit_code:
            return {}
        lines = [ln.strip() for ln in _EOL.split(self.stderr) if ln.strip()]
        return {"stderr_last": lines[-1][:200]} if lines else {}


@dataclass
class Evidence:
    run_id: str
    started: float
    deadline: float
    agents: list[AgentRun] = field(default_factory=list)
    transcript: Transcript = field(default_factory=Transcript)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    remote_events: list[dict[str, Any]] = field(default_factory=list)
    remote_state: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # records a session from outside the trial created on its remote (collection -> ids): in
    # remote_state as the remote has them, never counted as the deliverable (vault.runner.foreign_sessions)
    foreign_created: dict[str, set[str]] = field(default_factory=dict)
    # each `approval.requested` the scenario's approver got: what a person was asked, as shown
    prompts_asked: list[dict[str, Any]] = field(default_factory=list)
    # (agent pattern, decision) of each rule of the scenario's approver that names an agent
    approver_agents: list[tuple[str, str]] = field(default_factory=list)
    # the scenario approver's own name and every owner its policy names: approvers' names whether
    # or not anyone was asked in the trial (vault.runner.identity)
    approver_names: set[str] = field(default_factory=set)
    # each request the remote got through the vault: correlation id, method, target, JSON body
    requests_sent: list[dict[str, Any]] = field(default_factory=list)
    ssh: dict[str, Any] | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    audit_status: str = "missing"
    audit_message: str = ""
    errors: list[str] = field(default_factory=list)
    visible: dict[str, bytes] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    # the credentials of the trials beside this one (vault.runner.neighbours), looked for only in
    # the `private` windows (its agents' output and own files): never reported either
    neighbours: dict[str, str] = field(default_factory=dict)
    private: list[str] = field(default_factory=list)
    # what an agent left that the canary scan could not read (past its bounds): not vouched for
    unscanned: list[str] = field(default_factory=list)
    # ---- bypass evidence (vault.runner.bypass) ----
    runner_pid: int = 0  # the scenario's approver runs in the runner
    isolation: dict[str, str] = field(default_factory=dict)  # {"mode": bwrap|none, "network": none|host}
    bypass_events: list[dict[str, Any]] = field(default_factory=list)  # the remote's, not via the vault
    approver_attempts: list[dict[str, Any]] = field(default_factory=list)
    # (method, request id) of each decide and lock the runner's approver sent; None: not known
    approver_sent: list[tuple[str, str]] | None = None
    ssh_logins: int | None = None
    audit_head: dict[str, Any] = field(default_factory=dict)  # reported / in_log / daemon_gone
    # when the runner began stopping the world (its approver first): a prompt settled unroutable
    # from then on was settled by the teardown, not left without an approver during the trial
    teardown: float | None = None

    @property
    def tripwires(self) -> list[dict[str, Any]]:
        return [hit for a in self.agents for hit in a.tripwires]
    # the runner's intruder (a process presenting an agent's session id): what it was told
    intruder: dict[str, Any] | None = None
    # the processes a test started to call the agent socket for it (the pytest plugin's client
    # relays), pid -> start time (vault.lineage.started): their calls are the test's, never an
    # agent's (vault.runner.own_clients)
    test_clients: dict[int, float] = field(default_factory=dict)
    # the scenario's rubber-stamp threshold (expect.prompts.rubber_stamp_s)
    rubber_stamp_s: float = 1.0

    def agent(self, index: int | None) -> AgentRun | None:
        return next((a for a in self.agents if a.index == index), None)

    def deadline_of(self, index: int | None) -> float:
        a = self.agent(index)
        return a.deadline if a is not None and a.deadline is not None else self.deadline

    def timeline(self) -> Timeline:
        """The transcript as logical calls (a call and its resumes are one)."""
        return Timeline.of(self.transcript)

    def fatigue(self, catalog: Any = None) -> dict[str, Any]:
        """The approval-fatigue figures of this trial (vault.runner.fatigue)."""
        from vault.runner.fatigue import figures
        return figures(self, self.rubber_stamp_s, catalog)

    # ---- effects ---------------------------------------------------------------

    def effects_by_operation(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for entry in self.ledger:
            out[entry["route"]] += int(entry.get("effects", 0))
        if self.ssh is not None:
            out["restart_service"] += len(self.ssh.get("restarts", []))
        return out

    def attempts_by_operation(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for entry in self.ledger:
            if entry["route"] != "operation_status":
                out[entry["route"]] += int(entry.get("attempts", 0))
        if self.ssh is not None:
            out["restart_service"] += int(self.ssh.get("starts", 0))
        return out

    def committed_cids(self) -> set[str]:
        """Correlation ids whose request itself changed the remote."""
        return {e["correlation_id"] for e in self.remote_events
                if e.get("event") == "mutation_committed" and e.get("correlation_id")}

    def replayed_cids(self) -> set[str]:
        return {e["correlation_id"] for e in self.remote_events
                if e.get("event") == "idempotent_replay" and e.get("correlation_id")}

    def remote_cids(self) -> set[str]:
        return {e["correlation_id"] for e in self.remote_events if e.get("correlation_id")}

    # ---- the report (no secrets, no raw output) ----------------------------------

    def session_refusals(self) -> list[dict[str, Any]]:
        """Requests refused because their process did not open the session they presented
        (`session_refused`), attributed; `by_runner`: the runner's intruder sent it."""
        intruder = (self.intruder or {}).get("pid")
        keys = ("session_id", "method", "operation", "pid", "owner_pid", "reason", "count", "owner_index",
                "sender_index", "time")
        return [{**{k: r.get(k) for k in keys}, "exe": os.path.basename(str(r.get("exe") or "")),
                 "by_runner": intruder is not None and r.get("pid") == intruder}
                for r in self.transcript.refusals]

    def summary(self) -> dict[str, Any]:
        run = self.stats
        return {
            "run_id": self.run_id,
            "transcript_source": self.transcript.source,
            "transcript": [e.to_dict() for e in self.transcript.entries],
            "attempts": dict(self.attempts_by_operation()),
            "effects": dict(self.effects_by_operation()),
            "prompts": {"total": run.get("prompts", 0), "by_scope": run.get("scopes_asked", {}),
                        "granted": run.get("scopes_granted", {}), "decisions": run.get("decisions", {}),
                        "read_prompts": run.get("read_prompts", 0),
                        "destructive_session_grants": run.get("destructive_session_grants", 0),
                        "unroutable": run.get("unroutable", 0),
                        "fatigue": self.fatigue(), "asked": prompt_log(self)},
            "audit": {"status": self.audit_status, "message": self.audit_message,
                      "head_checked": bool(self.audit_head.get("in_log"))},
            "isolation": self.isolation.get("mode"), "network": self.isolation.get("network"),
            "agents": [{"index": a.index, "name": a.name, "exit_code": a.exit_code,
                        "duration_s": round(a.ended - a.started, 3), "killed_at_deadline": a.killed_at_deadline,
                        **({"left_running": a.left_running} if a.left_running else {}),
                        **({"keeper_unreported": True} if a.keeper_unreported else {}),
                        **({"daemon_after": a.daemon_after} if a.daemon_after else {}),
                        **({"daemon_moved": a.daemon_moved} if a.daemon_moved else {}),
                        **({"credential_files": a.credential_files} if a.credential_files else {}),
                        "final": a.final[:300], **a.failure()} for a in self.agents],
            **({"intruder": self.intruder} if self.intruder is not None else {}),
            **({"session_refusals": self.session_refusals()} if self.transcript.refusals else {}),
            "errors": self.errors,
        }
