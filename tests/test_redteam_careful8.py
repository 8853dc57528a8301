"""Red team, eighth pass: careful agents in a new language must not get a false FAIL.

tests/agents/rt8c_perl.pl is a careful agent in Perl (core modules only: IO::Socket::UNIX,
JSON::PP), written from docs/agent-contract.md and the README alone. Its styles (environment
variables, listed at its top) cover wire usage no earlier pass tried together: every string
character sent as a \\uXXXX escape, reversed key order and blanks around the line, string ids
with non-ASCII text, ids past 2**63, negative ids, one id reused for every request, requests
pipelined and answered out of order, `vault.status` heartbeats in flight beside a waiting call,
every request but `session.open` on a fresh connection of the same process, `wait_s` in
exponent form, shutdown(SHUT_WR) after `session.close`; recovery done differently (a lookup by
key before any resend or any first call, a resend under the same key as the reconciliation of an
idempotent operation, lookups until the deadline, `wait_s: 0` with sleeps); final messages as
text, JSON `status` words, a Result-shaped `ok`, pretty-printed nested JSON, colour codes, CRLF,
trailing blank lines, Latin-1 bytes, a line written in pieces; and the vault through
`vaultsim mcp` driven over stdio by hand. Sixteen styles over the shipped suite, two trials each,
gave no unexpected verdict that was the vault's (the report of the pass lists the sweep).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT
from test_redteam_careful import surprises, vaultsim_run
from vault.jail.probe import problem

AGENT = ROOT / "tests" / "agents" / "rt8c_perl.pl"
SCENARIOS = ROOT / "scenarios"

needs_perl = pytest.mark.skipif(shutil.which("perl") is None, reason="no perl here")
needs_bwrap = pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")


def perl(**env: str) -> str:
    words = [f"{k}={v}" for k, v in env.items()]
    return ("env " + " ".join(words) + " " if words else "") + f"perl {AGENT}"


def run(tmp: Path, paths: list[Path], cmd: str, *extra: str) -> dict[str, Any]:
    return vaultsim_run(paths, cmd, tmp / "r.json", "--trials", "1", *extra)


KEY = [SCENARIOS / f"{k}.yaml" for k in ("gate-4-lost-answer", "gate-6-restart-resumes-receipt",
                                         "c07-update-record-rate-limited")]

STYLES = {
    "escaped-string-ids-pipelined-heartbeat-poll": perl(RT8C_WIRE="escaped", RT8C_IDS="string", RT8C_PIPE="1",
                                                        RT8C_HEARTBEAT="1", RT8C_WAIT="poll", RT8C_FINAL="json"),
    "spaced-huge-ids-lookup-first-shutwr": perl(RT8C_WIRE="spaced", RT8C_IDS="huge", RT8C_LOOKUP="2",
                                                RT8C_SHUTWR="1", RT8C_FINAL="jsonok"),
    "same-id-per-call-connections-sleep-poll": perl(RT8C_IDS="same", RT8C_CONN="percall", RT8C_WAIT="sleep",
                                                    RT8C_NUM="exp", RT8C_FINAL="nested"),
}


@needs_perl
@pytest.mark.timeout(600)
@pytest.mark.parametrize("style", sorted(STYLES))
def test_a_perl_agent_with_unusual_but_valid_wire_is_released(tmp_path: Path, style: str) -> None:
    """Each style matches what a correct agent achieves on a lost answer, a restart that resumes
    its predecessor's approval and a rate limit (the jail where it can be built)."""
    result = run(tmp_path, KEY, STYLES[style])
    assert (0, []) == (result["code"], surprises(result)), result["out"][-3000:]


# ---- the contract made clearer -------------------------------------------------------------------


def test_the_contract_says_which_host_pid_the_vault_takes() -> None:
    """`session.open`'s `client.host_pid` must be a pid >= 1 (a label with 0 is refused, -32602).
    In the jail an agent's parent (its keeper) is outside its PID namespace and getppid()
    answers 0: a Perl agent that named its parent as its host passed every scenario without the
    jail and died at session.open in it. The contract now says to leave it out there."""
    text = (ROOT / "docs" / "agent-contract.md").read_text()
    assert "`host_pid` is a pid ≥ 1" in text and "`getppid()` answers 0" in text
    from pydantic import ValidationError

    from vault.daemon.sessions import ClientLabel
    with pytest.raises(ValidationError):
        ClientLabel(name="perl-careful", host_pid=0)
    assert ClientLabel(name="perl-careful", via="perl").host_pid is None


@needs_perl
@needs_bwrap
@pytest.mark.timeout(300)
def test_an_agent_naming_its_host_as_the_contract_says_is_released_in_the_jail(tmp_path: Path) -> None:
    """The same agent, leaving host_pid out where getppid() is 0, in the jail."""
    result = run(tmp_path, [SCENARIOS / "gate-1-healthy-delivery.yaml"], perl(RT8C_CLIENT="host"),
                 "--isolation", "bwrap")
    assert (0, []) == (result["code"], surprises(result)), result["out"][-3000:]


@needs_perl
@needs_bwrap
@pytest.mark.timeout(300)
def test_state_written_in_tmpdir_and_renamed_into_state_dir_fails_in_the_jail_as_the_contract_says(
        tmp_path: Path) -> None:
    """A careful agent wrote its state in $TMPDIR and renamed it into state_dir (an atomic
    replace): it passed gate-1 and gate-6 without the jail (both directories are in the trial's
    directory there) and crashed at its first save in the jail, where /tmp and state_dir are
    separate mounts (rename(2): EXDEV), so the restart in gate-6 asked again (FAIL_MEMORY). No
    bind layout lets a rename cross from the private /tmp into state_dir, so the contract now
    says where to write such a file; this keeps the page true."""
    text = " ".join((ROOT / "docs" / "agent-contract.md").read_text().split())
    assert "must be written in `state_dir` itself, as a rename from `/tmp` fails there (`EXDEV`" in text
    result = run(tmp_path, [SCENARIOS / "gate-1-healthy-delivery.yaml"], perl(RT8C_STATEWRITE="tmpdir"),
                 "--isolation", "bwrap")
    agent = result["json"]["scenarios"][0]["trial_results"][0]["agents"][0]
    assert agent["exit_code"] != 0 and "cross-device" in agent.get("stderr_last", ""), agent
