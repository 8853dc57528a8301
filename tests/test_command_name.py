"""A command named in a runner's error names its script, not only its interpreter's path (neigh45).

The scanner's error ("the remote refused N request(s) from outside the trial (... pid P (COMMAND)")
and a decoy's knock cut the command line at 60 characters, mostly `/tmp/ci0/.venv/bin/python /work/…`:
which program it was did not fit. vault.runner.command_name names the program and its first
argument by the ends of their paths, then what else fits.
"""

from __future__ import annotations

from vault.runner.command_name import command_name

VENV_PY = "/tmp/ci0/.venv/bin/python"
SCRIPT = "/work/wt/some-long-worktree-name/tests/agents/neigh45_x.py"


def test_the_script_is_named_after_a_long_interpreter_path() -> None:
    said = command_name(f"{VENV_PY} {SCRIPT} scan --target /tmp/x")
    assert said == "python …/neigh45_x.py scan --target /tmp/x", said
    # the old cut: 60 characters and the script's name gone
    assert "neigh45_x.py" not in f"{VENV_PY} {SCRIPT} scan"[:60]


def test_it_stays_within_its_limit_and_says_it_cut() -> None:
    said = command_name([VENV_PY, "-m", "vault.cli.main", "run", "scenarios/", "--agent", "x" * 200], limit=60)
    assert said.startswith("python -m vault.cli.main run scenarios/") and said.endswith("…"), said
    assert len(said) <= 60


def test_options_plain_words_and_unprintable_text() -> None:
    assert command_name("bash -c 'sleep 1'") == "bash -c 'sleep 1'"
    assert command_name("node") == "node"
    assert command_name("") == "?"
    assert "\\x1b" in command_name("/bin/evil \x1b[2J")  # escaped, never drawn on a terminal
