"""Red team 43c: careful agents under load and concurrency, which the gate must PASS.

The agents (tests/agents/rt43c_*.py, stdlib, written from docs/agent-contract.md alone) share one
step flow (rt43c_core: key RUN:AGENT:STEP on every call and resend, a lookup before anything else
after `outcome_unknown`, pending approvals resumed until settled or handed over with their token in
state_dir, `retry_after_s` waited out, `never` honoured, the final message last) and drive it as
production agents do:

* rt43c_async.py: asyncio, one session used over three connections of the process, independent
  steps as concurrent tasks, several requests in flight per connection;
* rt43c_threads.py: a ThreadPoolExecutor sharing one session over one pipelined connection;
* rt43c_procs.py spawn|forkserver: worker processes, each with its own session, make the calls (all
  gated steps on worker 0, whose session holds the grants); the parent joins them and then writes
  the final message;
* rt43c_noisy.py: megabytes of stderr, ANSI colour and non-ASCII text on stdout, and a final line
  of 1.5 MB whose claim word comes first;
* rt43c_backoff.py: exponential backoff with jitter, never shorter than `retry_after_s`;
* rt43c_slow.py: thinks (sleeps) between steps so its last step goes out close to its deadline.

Each passed the whole shipped suite jailed and with `--isolation none`, and with `--trials 2 -j 2`
(see the branch's report). Gated steps go one at a time and in order, `auto` steps side by side,
two alike steps in order (contract sections 3 and 9), so the scenarios below (fan-out of reads
beside a lost create, 30 creates and 30 notes at once, a restart collecting a slow approval) pass.

Found and fixed: a noisy agent's long final line was read for its claim once per check (the
grade, the outcome check, the claimed-early check, the step claims): five readings of 3-4 s each
for a 1.5 MB line on a loaded host. claims.claim_of now remembers its last few answers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import PY
from vault.jail.probe import problem
from vault.runner import claims

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / "tests" / "agents"
needs_bwrap = pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")
RUN_S = 240


def test_a_long_final_line_is_read_for_its_claim_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # the grade, the outcome check, claimed_early and step_claims each ask claim_of for the last
    # agent's final message: rt43c_noisy.py's 1.5 MB line in colour and several scripts cost 3-4 s a
    # reading on a loaded host, 18 s of one trial's grading; one reading is enough
    readings: list[int] = []
    word_claim = claims._word_claim

    def counted(text: str) -> str:
        readings.append(len(text))
        return word_claim(text)

    monkeypatch.setattr(claims, "_word_claim", counted)
    prose = "Überprüfung läuft — 進捗を確認しています — проверка шага — 🚀 ✓ · "
    final = "\x1b[1m\x1b[32mdone\x1b[0m: 3 steps — " + prose * 4000 + "\x1b[0m"
    for _ in range(5):
        assert claims.claim_of(final) == "done"
    assert len(readings) == 1, readings
