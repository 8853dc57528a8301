"""vaultsim installed the way a new user installs it: a wheel in a fresh venv, used away from any checkout.

The test builds the wheel from a copy of the source tree (`pip wheel`, with
the build backend from the package index), installs it with the pinned
dependency versions into a new venv, and from a directory with no
`scenarios/` runs the documented commands: `--version`, `run` (the shipped
suite), `daemon` / `status` / `stop`, `init x` and `run x`, and `demo` in a
real terminal (tmux), quit with `q`. Slow (a build, an install and the whole
suite), and run by CI all the same: it is the only test of the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import ROOT, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SKIP = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                              ".hypothesis", ".lock-venv", "reports")


class Installed:
    def __init__(self, venv: Path, work: Path) -> None:
        self.venv, self.work = venv, work
        self.bin = venv / "bin" / "vaultsim"
        # nothing may point back at the checkout or at another vault
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("VAULTSIM_", "PYTHON", "VIRTUAL_ENV")) and k not in ("COLUMNS", "LINES")}
        self.env.update(PATH=f"{venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                        VAULTSIM_HOME=str(work / "h"), VAULTSIM_KEYRING_DIR=str(work / "kr"),
                        PYTHON_KEYRING_BACKEND="vault.keyring_backend.FileKeyring")

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin), *args], cwd=self.work, env=self.env, capture_output=True, text=True,
                              timeout=timeout)


@pytest.fixture(scope="module")
def installed() -> Iterator[Installed]:
    top = Path(tempfile.mkdtemp(prefix="vsw-", dir="/tmp"))
    try:
        src, dist, venv, work = top / "src", top / "dist", top / "venv", top / "work"
        shutil.copytree(ROOT, src, symlinks=True, ignore=SKIP)
        build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(src)],
                               capture_output=True, text=True, timeout=600)
        assert 0 == build.returncode, build.stdout + build.stderr
        wheel = next(dist.glob("vaultsim-*.whl"))
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        install = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c",
                                  str(ROOT / "constraints.txt"), str(wheel)], capture_output=True, text=True,
                                 timeout=900)
        assert 0 == install.returncode, install.stdout + install.stderr
        shutil.rmtree(src)  # no source left to fall back on
        work.mkdir()
        yield Installed(venv, work)
    finally:
        home = top / "work" / "h"
        if (home / "agent.sock").exists():
            subprocess.run([str(top / "venv" / "bin" / "vaultsim"), "stop", "--home", str(home)],
                           capture_output=True, timeout=60)
        shutil.rmtree(top, ignore_errors=True)


class TestWheel:
    def test_imports_come_from_the_venv(self, installed: Installed) -> None:
        out = subprocess.run([str(installed.venv / "bin" / "python"), "-c",
                              "import vault, tui, agent_stub, vault.resources as r; "
                              "print(vault.__file__); print(r.CATALOG); print(r.SCENARIOS)"],
                             cwd=installed.work, env=installed.env, capture_output=True, text=True, timeout=60)
        assert 0 == out.returncode, out.stderr
        for line in out.stdout.splitlines():
            assert line.startswith(str(installed.venv)), line
        assert not (installed.work / "scenarios").exists()

    def test_version(self, installed: Installed) -> None:
        import vault
        out = installed.run("--version")
        assert (0, f"vaultsim {vault.__version__}\n") == (out.returncode, out.stdout)

    def test_run_with_no_path_runs_the_shipped_suite(self, installed: Installed) -> None:
        """`vaultsim run` with no path: the suite inside the wheel, release OK (exit 0)."""
        out = installed.run("run", "-q", "--json", "report.json", timeout=900)
        assert 0 == out.returncode, out.stdout[-4000:] + out.stderr[-2000:]
        doc = json.loads((installed.work / "report.json").read_text())
        assert doc["summary"]["scenarios"] >= 30 and doc["summary"]["errors"] == []
        assert "release OK" in out.stdout

    def test_daemon_status_stop(self, installed: Installed) -> None:
        started = installed.run("daemon", "--unlocked")
        assert 0 == started.returncode, started.stderr
        assert 0 == installed.run("status").returncode  # running, unlocked
        assert 0 == installed.run("lock").returncode
        assert 2 == installed.run("status").returncode  # running, locked
        assert 0 == installed.run("stop").returncode
        assert 1 == installed.run("status").returncode  # not running

    def test_init_then_run(self, installed: Installed) -> None:
        assert 0 == installed.run("init", "x").returncode
        out = installed.run("run", "x", timeout=300)
        assert 0 == out.returncode, out.stdout + out.stderr

    @pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
    def test_demo_starts_and_quits_with_q(self, installed: Installed) -> None:
        sock, status = str(installed.work / "tmux.sock"), installed.work / "demo-exit"
        conf = installed.work / "tmux.conf"
        conf.write_text("set -g remain-on-exit on\n")

        def tmux(*args: str) -> str:
            return subprocess.run(["tmux", "-S", sock, "-f", str(conf), *args], capture_output=True, text=True,
                                  timeout=30, check=True, env=installed.env).stdout

        try:
            tmux("new-session", "-d", "-s", "demo", "-x", "80", "-y", "24", "-c", str(installed.work),
                 f"{installed.bin} demo; echo $? > {status}")
            wait_for(lambda: " q quit" in tmux("capture-pane", "-p", "-t", "demo"), timeout=120,
                     what="the demo's approver, its footer whole at 80x24")
            tmux("send-keys", "-t", "demo", "q")
            wait_for(lambda: status.exists() and status.read_text().endswith("\n"), timeout=120,
                     what="the demo to exit")
            assert "0\n" == status.read_text(), tmux("capture-pane", "-p", "-t", "demo")
        finally:
            subprocess.run(["tmux", "-S", sock, "kill-server"], capture_output=True, timeout=30)
