"""The README's hands-on sections, run as they stand there, so the text cannot drift from the tool.

"A session by hand" is extracted from README.md and run by bash at the top of
the project, with the project's venv (as after `make run`), under `set -e`:
each command must succeed, the agent must file its issue through one prompt,
the log must verify, and nothing may be left running or on disk. "Pointing an
operation at a real service" is run the same way: its two YAML files
written out, its commands run against a real local HTTP server.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest

from helpers import ROOT

README = ROOT / "README.md"
ACTIVATE = ROOT / ".venv" / "bin" / "activate"

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not ACTIVATE.exists(), reason="needs the project's .venv (`make run` makes it)")]


def section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n### {title}\n")
    end = text.find("\n## ", start + 1)
    following = text.find("\n### ", start + 1)
    return text[start: min(x for x in (end, following, len(text)) if x > 0)]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def clean_env(**extra: str) -> dict[str, str]:
    """A fresh shell's environment: nothing of the test runner's venv or vault."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VAULTSIM_", "VIRTUAL_ENV", "PYTHON")) and k not in ("COLUMNS", "LINES")}
    env.update(extra)
    return env


def run_block(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """bash -e on the block, its output in files, not pipes: a step that fails midway then
    reports what it printed at once, instead of waiting on a background child that holds a pipe."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        code = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, stdout=out, stderr=err,
                              timeout=240, stdin=subprocess.DEVNULL, start_new_session=True).returncode
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(["bash"], code, out.read(), err.read())


def left_running(marker: str) -> list[str]:
    """Processes whose command line or environment still mentions `marker`."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) or marker in str(p.environ()):
                found.append(" ".join(p.info["cmdline"] or []))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


class TestSessionByHand:
    def test_pasted_into_a_fresh_shell(self) -> None:
        """The block runs from top to bottom, does what its comments say, and leaves nothing behind."""
        (script,) = blocks(section("A session by hand"), "sh")
        out = run_block(script, ROOT, clean_env())
        assert 0 == out.returncode, out.stdout + out.stderr
        home = re.search(r"vaultsim daemon: serving (/tmp/vs-[A-Za-z0-9]+)/home", out.stdout)
        assert home, out.stdout
        work = home.group(1)
        assert "done: filed the issue" in out.stdout  # the agent's final message
        assert re.search(r"run .*: 1 prompt \(", out.stdout), out.stdout  # "1 prompt", not "1 prompts"
        assert "create_issue on tracker" in out.stdout and "intact" in out.stdout
        assert "vault unlocked" in out.stdout and "stopped" in out.stdout
        assert not Path(work).exists()
        assert [] == left_running(work)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


class TestRealService:
    def test_an_operation_against_a_local_http_service(self) -> None:
        """config.yaml + ops.yaml from the README, the commands after them: the agent's call succeeds."""
        if not port_free(8000):
            pytest.skip("port 8000, which the README's example uses, is taken")
        text = section("Pointing an operation at a real service")
        work = Path(tempfile.mkdtemp(prefix="vs-", dir="/tmp"))
        try:
            for body in blocks(text, "yaml"):
                name = re.match(r"# (\S+\.yaml)", body)
                assert name, body[:80]
                (work / name.group(1)).write_text(body)
            (script,) = blocks(text, "sh")
            env = clean_env(VAULTSIM_HOME=str(work / "home"), VAULTSIM_KEYRING_DIR=str(work / "keyring"),
                            PYTHON_KEYRING_BACKEND="vault.store.keyring_backend.FileKeyring",
                            STATUS_TOKEN="tok-readme-example")
            out = run_block(f"source {ACTIVATE}\n{script}", work, env)
            assert 0 == out.returncode, out.stdout + out.stderr
            assert '"ok":true,"category":"success","operation":"read_status"' in out.stdout
            assert "GET /status.json HTTP/1.1\" 200" in out.stderr  # the local service saw the call
            assert "tok-readme-example" not in out.stdout + out.stderr
            assert [] == left_running(str(work))
        finally:
            shutil.rmtree(work, ignore_errors=True)
