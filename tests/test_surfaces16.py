"""The installed CLI used as a newcomer would, from a wheel, outside the checkout (surfaces16).

Each test failed before its fix:

    a user without CAP_SYS_PTRACE   every trial of `vaultsim run` (and of the pytest plugin: the
                                    same fork server) failed: the fork server opened the agent's
                                    stdout as /proc/<runner>/fd/N, which a non-dumpable runner
                                    closes to every process but root's; a traceback per trial and
                                    RELEASE BLOCKED on a healthy suite, for any non-root user;
                                    and as root in a container (no CAP_SYS_PTRACE by default) the
                                    remote read the daemon's socket as not the vault's (a readlink
                                    refused read as "not held"): FAIL_SECRET_LEAK on every call
    nohup vaultsim run &            a SIGHUP the shell set to be ignored (nohup; SIGINT of a
                                    script's `&` job) stopped the run anyway when the terminal closed
    a YAML error                    "line 3 not valid YAML": no column, no reason
    --agent "a b/agent.sh"          an unquoted path with spaces ran the program `a` (`dir` is one)
                                    in every trial; the plugin's --vaultsim-agent alike
    a venv under /tmp               `run --no-fork-server`: the venv's python was not in the jail
                                    (the read-only bind of its site-packages, agent_stub's
                                    directory, kept the venv out): exit 127 in every trial
    approver.deny(42)               a TypeError from inside fnmatch, not the rule's mistake
    stats --run TYPO                "no prompts yet" of a vault that had asked: a CI step that reads
                                    the prompt count of a mistyped run read 0 and passed
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PY, ROOT
from vault.pytest_plugin.world import Vaultsim

C01 = str(ROOT / "vault" / "scenarios" / "c01-read-issue-dns.yaml")
GATE_1 = str(ROOT / "vault" / "scenarios" / "gate-1-healthy-delivery.yaml")  # reaches the remote


def _cli(cwd: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, PY, "-m", "vault.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=180)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to drop CAP_SYS_PTRACE (what every other user lacks)")
def test_run_passes_for_a_user_without_ptrace(tmp_path: Path) -> None:
    """A non-root user has no CAP_SYS_PTRACE, and nor has root in a container by default (Docker,
    the GitLab recipe's `image: python:3.11`): root without it stands for both."""
    out = _cli(tmp_path, "run", C01, GATE_1, "-q",
               prefix=("setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "Permission denied" not in out.stderr, out.stderr


def test_a_signal_ignored_by_nohup_stays_ignored(tmp_path: Path) -> None:
    """`nohup vaultsim run … &`: closing the terminal (SIGHUP) must not stop the run."""
    out, err = tmp_path / "out", tmp_path / "err"

    def ignore_hup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does before it execs

    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen([PY, "-m", "vault.cli.main", "run", C01, "-q"], cwd=tmp_path, stdout=o, stderr=e,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=ignore_hup)
    try:
        deadline = time.monotonic() + 60
        # the header is printed once the run's signal handlers are in place
        while "isolation:" not in out.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGHUP)
        rc = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert rc == 0, out.read_text() + err.read_text()
    assert "release OK" in out.read_text() and "SIGHUP" not in err.read_text(), err.read_text()


def test_a_yaml_error_names_line_column_and_why(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("title: ok\nexpect:\n  verdict: [PASS\nagents: []\n")
    out = _cli(tmp_path, "run", "bad.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "bad.yaml: line 4, column 7: not valid YAML: did not find expected ',' or ']'" in out.stderr, out.stderr


def test_stats_of_a_run_with_no_prompts_says_which_runs_have_them(vaultsim: Vaultsim, tmp_path: Path) -> None:
    """A mistyped `--run` said "no prompts yet" of a vault that had asked: CI read 0 prompts as fine."""
    vaultsim.approver.allow_once("create_issue")
    vaultsim.run_agent(plan={"agent": "filer", "steps": [{"call": "create_issue", "params": {"title": "t"}}],
                             "final": "done"})
    assert vaultsim.prompts.count == 1
    out = _cli(tmp_path, "stats", "--home", str(vaultsim.home), "--run", "no-such-run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"no prompts in run 'no-such-run' (runs with prompts: {vaultsim.run_id})", out.stdout


def test_an_agent_path_with_spaces_left_unquoted_is_named(tmp_path: Path) -> None:
    """`--agent "my agents/agent.sh"` ran the program `my` (or `dir`, a coreutils program, for
    "dir with space/…") with the rest as arguments, and every trial failed saying why not."""
    (tmp_path / "dir with space").mkdir()
    script = tmp_path / "dir with space" / "my agent.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    out = _cli(tmp_path, "run", C01, "--agent", "dir with space/my agent.sh")
    assert out.returncode == 2, out.stdout + out.stderr
    assert ("--agent: 'dir with space/my agent.sh' is one file, but read as shell words it runs 'dir': "
            "quote it, e.g. --agent \"'dir with space/my agent.sh'\"") in out.stderr, out.stderr


def test_plugin_agent_path_with_spaces_left_unquoted_is_a_usage_error(pytester: pytest.Pytester) -> None:
    (pytester.path / "my agents").mkdir()
    script = pytester.path / "my agents" / "agent.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    pytester.makepyfile("def test_x():\n    pass\n")
    out = pytester.runpytest_subprocess("--vaultsim-agent", "my agents/agent.sh")
    assert out.ret == pytest.ExitCode.USAGE_ERROR, out.stdout.str() + out.stderr.str()
    assert ("'my agents/agent.sh' is one file, but read as shell words it runs 'my': quote it, "
            "e.g. --vaultsim-agent \"'my agents/agent.sh'\"") in out.stderr.str()


def test_a_venv_in_tmp_is_in_the_jail_when_its_packages_are_the_agents_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--no-fork-server` with vaultsim in a venv under /tmp (`python -m venv /tmp/venv`, common in CI):
    agent_stub's directory is the venv's site-packages, bound read-only, and that bind kept the
    whole venv out of the jail: "No such file or directory: '/tmp/venv/bin/python3'" in every trial."""
    import vault.resources
    from vault.jail.spec import Bind, JailSpec

    assert str(tmp_path).startswith("/tmp/")
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    monkeypatch.setattr("sys.prefix", str(tmp_path))
    monkeypatch.setattr(vault.resources, "IMPORT_ROOT", site)
    ro = JailSpec(binds=(Bind(str(site), str(site)),), cwd=str(site))
    assert ro._own_install() == [str(tmp_path)]
    # a writable bind inside it would be shadowed by the read-only venv: the venv stays out
    (tmp_path / "work").mkdir()
    rw = JailSpec(binds=(Bind(str(tmp_path / "work"), str(tmp_path / "work"), True),))
    assert ro._own_install() != rw._own_install() and str(tmp_path) not in rw._own_install()


def test_an_approver_rule_that_is_not_a_pattern_says_so(vaultsim: Vaultsim) -> None:
    """`approver.deny(42)` (or a list of names) was a TypeError from deep inside fnmatch."""
    from vault.errors import BadInput

    for wrong in (42, ["delete_release"]):
        with pytest.raises(BadInput, match=r"approver rule: the operation is a shell pattern string "
                                           r"\(e\.g\. 'delete_\*'\), not "):
            vaultsim.approver.deny(wrong)  # type: ignore[arg-type]
