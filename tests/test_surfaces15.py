"""The ways users put their own agents under test, used as a newcomer would (surfaces15).

Each test failed before its fix:

    --agent "'python3"          an unclosed quote: a ValueError traceback and exit 3 ("a bug in
                                vaultsim"); the plugin's --vaultsim-agent and run_agent alike
    a missing #! interpreter    every trial ran and failed, each saying "No such file or directory:
                                './agent.py'" of a script that is there; a CRLF #! line the same;
                                an executable script with no #! line: "Exec format error" each trial
    vaultsim exec               a file there but not executable was "no program"; a missing #!
                                interpreter got past the check (then 127 naming the script)
    run --json -                wrote a file named '-' in the current directory (stdout by habit)
    pytest --fixtures           "no docstring available" for vaultsim, vaultsim_factory
    MCP needs an extra          the README's MCP section never said `pip install 'vaultsim[mcp]'`;
                                a newcomer's `vaultsim mcp` exited 2 on an undocumented condition
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import PY, ROOT
from vault.errors import BadInput
from vault.pytest_plugin.world import Vaultsim

GATE_1 = str(ROOT / "vault" / "scenarios" / "gate-1-healthy-delivery.yaml")


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "vault.cli.main", "run", GATE_1, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=180)


@pytest.mark.parametrize("agent, said", [
    ("'python3", "--agent: \"'python3\" is not a command a shell could read: no closing quotation"),
    ("python3 agent.py \\", "is not a command a shell could read: no escaped character"),
])
def test_agent_a_shell_could_not_read_is_bad_input(tmp_path: Path, agent: str, said: str) -> None:
    out = _run(tmp_path, "--agent", agent)
    assert out.returncode == 2, out.stdout + out.stderr
    assert said in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_leading_variable_assignment_suggests_env(tmp_path: Path) -> None:
    """`--agent "RT_MODE=1 python3 agent.py"` works in a shell but the command runs without one: it
    was refused as "no program 'RT_MODE=1' on PATH", true but no help to the user."""
    out = _run(tmp_path, "--agent", "RT_MODE=1 python3 agent.py")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no program 'RT_MODE=1' on PATH" in out.stderr and "(env RT_MODE=1 …)" in out.stderr, out.stderr
    assert "[1/1]" not in out.stdout


@pytest.mark.parametrize("head, said", [
    (b"#!/usr/bin/vaultsim-no-such-python\n", "its #! line names the interpreter "
                                              "'/usr/bin/vaultsim-no-such-python', which is not an executable file"),
    (b"#!/usr/bin/env python3\r\n", "its #! line ends in a carriage return (the file has Windows line ends)"),
    (b"#!/usr/bin/env vaultsim-no-such-python\n", "its #! line runs 'vaultsim-no-such-python' through env, "
                                                  "and there is no 'vaultsim-no-such-python' on PATH"),
    (b"import sys\n", "has no #! line, so it cannot be started as a program"),  # exec: ENOEXEC
])
def test_script_whose_interpreter_is_missing_is_refused_before_any_trial(tmp_path: Path, head: bytes,
                                                                          said: str) -> None:
    """exec's ENOENT named the script ("No such file or directory: './agent.py'") in each trial's
    output, after the whole selection had run."""
    script = tmp_path / "my agent.py"  # a space too: the message quotes the program as given
    script.write_bytes(head + b"print('done')\n")
    script.chmod(0o755)
    out = _run(tmp_path, "--agent", "'./my agent.py'")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "vaultsim run: --agent: './my agent.py'" in out.stderr and said in out.stderr, out.stderr
    assert "[1/1]" not in out.stdout  # refused before any trial


@pytest.mark.parametrize("head, mode, said", [
    (b"#!/usr/bin/vaultsim-no-such-python\n", 0o755, "'./agent.py': its #! line names the interpreter "
                                                   "'/usr/bin/vaultsim-no-such-python', which is not an executable file"),
    (b"#!/bin/sh\n", 0o644, "'./agent.py' is not an executable file"),
])
def test_exec_names_why_a_program_cannot_start(tmp_path: Path, head: bytes, mode: int, said: str) -> None:
    """`vaultsim exec` said "no program './agent.py'" of a file that is there but not executable, and
    took one whose interpreter is missing (then 127, "No such file or directory: './agent.py'")."""
    (tmp_path / "agent.py").write_bytes(head)
    (tmp_path / "agent.py").chmod(mode)
    out = subprocess.run([PY, "-m", "vault.cli.main", "exec", "--home", str(tmp_path / "h"), "--", "./agent.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and f"vaultsim exec: {said}" in out.stderr, out.stderr


@pytest.mark.parametrize("option", ["--json", "--junit"])
def test_report_to_dash_is_refused_not_a_file_named_dash(tmp_path: Path, option: str) -> None:
    out = _run(tmp_path, option, "-")
    assert out.returncode == 2 and f"vaultsim run: {option} -: give a file name" in out.stderr, out.stderr
    assert not (tmp_path / "-").exists()


def test_agent_in_a_directory_with_spaces_runs(tmp_path: Path) -> None:
    """The checks above read the #! line of a good script too: a careful agent quoted into a
    directory with spaces is released."""
    where = tmp_path / "my agents"
    where.mkdir()
    script = where / "careful agent.py"
    script.write_bytes(b"#!" + PY.encode() + b"\n" + (ROOT / "tests" / "agents" / "careful.py").read_bytes())
    script.chmod(0o755)
    out = _run(tmp_path, "--agent", "'my agents/careful agent.py'", "--isolation", "none")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "release OK" in out.stdout


def test_run_agent_with_an_unclosed_quote_is_bad_input(vaultsim: Vaultsim) -> None:
    with pytest.raises(BadInput, match="run_agent: .* is not a command a shell could read"):
        vaultsim.run_agent("python3 'my_agent.py", task={"operations": ["read_issue"]})


def test_plugin_agent_with_an_unclosed_quote_is_a_usage_error(pytester: pytest.Pytester) -> None:
    (pytester.path / "sc.yaml").write_text("agents: [{plan: {steps: []}}]\nexpect: {verdict: PASS}\n")
    out = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vaultsim-scenarios",
                                        "--vaultsim-agent", "python3 'x.py")
    text = out.stdout.str() + out.stderr.str()
    assert "--vaultsim-agent: \"python3 'x.py\" is not a command a shell could read" in text, text[-2000:]
    assert "Traceback" not in text and out.ret == pytest.ExitCode.USAGE_ERROR


def test_fixtures_say_what_they_are(pytester: pytest.Pytester) -> None:
    """`pytest --fixtures` is where a newcomer looks first."""
    out = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fixtures")
    text = out.stdout.str()
    for name in ("vaultsim", "vaultsim_factory", "vaultsim_engine"):
        block = text[text.index(f"\n{name} "):][:400].splitlines()
        assert "no docstring available" not in block[1], block
    assert "@pytest.mark.vaultsim(...)" in text


HIDE_MCP = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "mcp" or name.startswith("mcp."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
from vault.cli.main import main
sys.argv = ["vaultsim", "mcp"]
sys.exit(main())
"""


def test_the_mcp_extra_is_documented_where_users_look(tmp_path: Path) -> None:
    """Without the SDK the bridge says how to install it (exit 2); the README's MCP section and
    its command table say the same."""
    env = {**os.environ, "VAULTSIM_HOME": str(tmp_path / "h")}
    out = subprocess.run([PY, "-c", HIDE_MCP], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "pip install 'vaultsim[mcp]'" in out.stderr
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## MCP: the vault in an LLM host"):]
    section = section[:section.index("**What the host discovers.**")]
    assert "pip install 'vaultsim[mcp]'" in section
    row = next(ln for ln in readme.splitlines() if ln.startswith("| `vaultsim mcp "))
    assert re.search(r"2 .*without the MCP SDK", row), row


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
