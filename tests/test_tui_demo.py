"""`vaultsim demo` and `vaultsim tui` in a real terminal (tmux): approve, watch, quit, nothing left.

The demo runs in a detached tmux session on a private tmux socket. The test
reads the screen with `capture-pane`, answers the three prompts with keys,
waits for both demo agents to finish, quits with `q`, and then checks with
psutil that every process the demo started is gone and that its temporary
home was removed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from helpers import PY, ROOT, Sandbox, wait_for
from vault.lineage import started

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]

HOME_RE = re.compile(r"home (/tmp/vsd-[A-Za-z0-9_]+)/h\b")


class Tmux:
    """One detached tmux session on a private server, so a user's tmux is never touched."""

    def __init__(self, root: Path) -> None:
        self.status_file = root / "exit-status"
        self.sock = str(root / "tmux.sock")
        conf = root / "tmux.conf"
        conf.write_text("set -g remain-on-exit on\n")  # keep the pane: its last screen is checked
        self.conf = str(conf)

    def run(self, *args: str) -> str:
        # the server copies this environment into the pane; a COLUMNS/LINES left there
        # by the test runner would override the real 160x50 terminal size
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        out = subprocess.run(["tmux", "-S", self.sock, "-f", self.conf, *args], capture_output=True,
                             text=True, timeout=30, check=True, env=env)
        return out.stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "demo")

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "demo", *keys)

    def pane(self, fmt: str) -> str:
        return self.run("display-message", "-p", "-t", "demo", fmt).strip()

    def start(self, command: str) -> int:
        """Run `command` in a 160x50 pane; returns the pane's process id."""
        # the pane's shell writes the exit status down: tmux itself does not
        # always reap a pane's process promptly enough to report it
        wrapped = f"{command}; echo $? > {self.status_file}"
        self.run("new-session", "-d", "-s", "demo", "-x", "160", "-y", "50", "-c", str(ROOT), wrapped)
        return int(self.pane("#{pane_pid}"))

    def exit_status(self, timeout: float = 60) -> int:
        def written() -> str | None:
            text = self.status_file.read_text() if self.status_file.exists() else ""
            return text if text.endswith("\n") else None
        return int(wait_for(written, timeout=timeout, what="the command in the pane to end"))

    def kill(self) -> None:
        subprocess.run(["tmux", "-S", self.sock, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    root = Path(tempfile.mkdtemp(prefix="vst-", dir="/tmp"))
    t = Tmux(root)
    try:
        yield t
    finally:
        t.kill()
        shutil.rmtree(root, ignore_errors=True)


def descendants(pid: int) -> set[tuple[int, float]]:
    """(pid, start time) of a process and everything below it: a pid alone could be reused."""
    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return set()
    out = set()
    for p in procs:
        try:
            out.add((p.pid, started(p.pid) or 0.0))
        except psutil.NoSuchProcess:
            pass
    return out


def alive(ident: tuple[int, float]) -> bool:
    try:
        p = psutil.Process(ident[0])
        return started(ident[0]) == ident[1] and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start_demo(tmux: Tmux, before: str = "") -> int:
    vaultsim = Path(PY).with_name("vaultsim")
    return tmux.start(before + (f"{vaultsim} demo" if vaultsim.exists() else f"{PY} -m vault.cli.main demo"))


def demo_at_first_prompt(tmux: Tmux, before: str = "") -> tuple[psutil.Process, set[tuple[int, float]], Path]:
    """Start the demo; once its first prompt shows: the demo's process, every process seen, its home."""
    pane = start_demo(tmux, before)
    seen: set[tuple[int, float]] = set()

    def prompt_shown() -> str | None:
        seen.update(descendants(pane))
        text = tmux.screen()
        return text if " 1 pending" in text and "create_issue" in text else None

    first = wait_for(prompt_shown, timeout=60, what="the first prompt")
    home = Path(HOME_RE.search(first).group(1))  # type: ignore[union-attr]
    assert len(seen) >= 4  # the pane's shell, the demo, the daemon, the agent waiting for us
    demo = next(p for p in psutil.Process(pane).children() if "demo" in p.cmdline())
    return demo, seen, home


def scrollback(tmux: Tmux) -> str:
    """The pane's text with what scrolled off it: the lines written after the TUI ended."""
    return tmux.run("capture-pane", "-p", "-t", "demo", "-S", "-200")


class TestDemo:
    def test_demo_approve_watch_quit_leaves_nothing(self, tmux: Tmux) -> None:
        """Approve the demo's prompts by key, both agents finish, `q` stops everything and removes the home."""
        demo_pid = start_demo(tmux)
        seen: set[tuple[int, float]] = set()

        last = [""]

        def screen_with(*needles: str) -> str | None:
            seen.update(descendants(demo_pid))  # every process the demo has started so far
            last[0] = text = tmux.screen()
            return text if all(n in text for n in needles) else None

        def until_screen(*needles: str, what: str) -> str:
            try:
                return wait_for(lambda: screen_with(*needles), timeout=60, what=what)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; the screen was:\n{last[0]}") from None

        def answer(op: str, key: str, *also: str) -> str:
            text = until_screen(" 1 pending", f" {op} ", *also, what=f"the {op} prompt")
            tmux.keys(key)
            return text

        first = answer("create_issue", "s", "allow for session: create_issue on tracker until process")
        home = Path(HOME_RE.search(first).group(1))  # type: ignore[union-attr]
        assert home.is_dir()
        assert "read_issue -> success" in first  # the read went through without a prompt
        answer("delete_release", "o", "allow for session: not offered")
        answer("create_issue", "s", "agent 2, a fresh process")  # asked again: the grant died with agent 1
        done = until_screen("demo: finished", what="the demo to finish")
        assert 2 == done.count("exited 0")
        assert "a granted scope was asked again" in done  # the fatigue warning for the repeat
        assert len(seen) >= 5  # the demo, the remote, the daemon, two agents (at least)

        tmux.keys("q")
        assert 0 == tmux.exit_status()
        after = tmux.screen()
        assert "Traceback" not in after
        assert [] == [ident for ident in seen if alive(ident)]
        assert not home.exists()

    def test_closing_the_terminal_cleans_up_too(self, tmux: Tmux) -> None:
        """Killing the tmux session mid-prompt (SIGHUP) stops every demo process and removes the home."""
        demo_pid = start_demo(tmux)
        seen: set[tuple[int, float]] = set()

        def prompt_shown() -> str | None:
            seen.update(descendants(demo_pid))
            text = tmux.screen()
            return text if " 1 pending" in text and "create_issue" in text else None

        home = Path(HOME_RE.search(wait_for(prompt_shown, timeout=60, what="the first prompt")).group(1))  # type: ignore[union-attr]
        assert len(seen) >= 4  # the demo, the remote, the daemon, the agent waiting for us
        tmux.run("kill-session", "-t", "demo")
        wait_for(lambda: not any(alive(i) for i in seen), timeout=60, what="every demo process to stop")
        wait_for(lambda: not home.exists(), timeout=30, what="the demo home to be removed")


class TestDemoSignals:
    """The demo follows vault.stop_signals' rule: SIGINT, SIGTERM and a SIGHUP not ignored at
    start each tear its world down as `q` does and exit 128 + the signal, as `vaultsim tui` does
    (SIGTERM exited 0, as if `q` were pressed); a SIGHUP ignored at start (nohup) stays ignored
    (it killed the demo, with its agents and daemon torn down: the rest of the demo lost)."""

    @pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
    def test_a_stop_signal_ends_it_like_q_and_exits_128_plus_it(self, tmux: Tmux, sig: signal.Signals) -> None:
        demo, seen, home = demo_at_first_prompt(tmux)
        os.kill(demo.pid, sig)
        assert 128 + sig == tmux.exit_status()
        wait_for(lambda: not any(alive(i) for i in seen), timeout=60, what="every demo process to stop")
        assert not home.exists()
        said = scrollback(tmux)
        assert "Traceback" not in said, said
        if sig == signal.SIGINT:  # one line, as every command says it
            assert "vaultsim demo: interrupted (Ctrl-C); stopped" in said, said
        else:
            assert f"vaultsim demo: {sig.name}: stopped " in said and f"removed {home}" in said, said

    def test_a_signal_while_the_world_starts_still_leaves_nothing(self, tmux: Tmux) -> None:
        """SIGTERM as soon as the demo's daemon exists (set-up under way, or just done): the
        world is finished and torn down, the TUI never needed; 143, nothing left."""
        pane = start_demo(tmux)
        seen: set[tuple[int, float]] = set()
        homes: set[str] = set()

        def daemon_started() -> bool:
            seen.update(descendants(pane))
            for pid, _ in seen:
                with contextlib.suppress(psutil.Error):
                    p = psutil.Process(pid)
                    if "daemon" in p.cmdline():
                        homes.add(p.environ().get("VAULTSIM_HOME", ""))
                        return True
            return False

        wait_for(daemon_started, timeout=60, interval=0.01, what="the demo's daemon")
        demo = next(p for p in psutil.Process(pane).children() if "demo" in p.cmdline())
        os.kill(demo.pid, signal.SIGTERM)
        assert 128 + signal.SIGTERM == tmux.exit_status()
        wait_for(lambda: not any(alive(i) for i in seen), timeout=60, what="every demo process to stop")
        (home,) = homes
        assert home.startswith("/tmp/vsd-") and not Path(home).parent.exists(), home
        said = scrollback(tmux)
        assert "Traceback" not in said and "vaultsim demo: SIGTERM: stopped " in said, said

    def test_a_hang_up_ignored_at_start_stays_ignored(self, tmux: Tmux) -> None:
        """Started with SIGHUP ignored (`nohup`, `trap '' HUP`): a HUP changes nothing, the demo goes on."""
        demo, seen, home = demo_at_first_prompt(tmux, before="trap '' HUP; ")
        os.kill(demo.pid, signal.SIGHUP)  # ignored by the kernel, or caught: either way settled now
        tmux.keys("s")
        # the next prompt: the demo, its daemon and its agent all carried on after the HUP
        wait_for(lambda: " 1 pending" in (t := tmux.screen()) and " delete_release " in t, timeout=60,
                 what="the second prompt")
        assert demo.is_running()
        tmux.keys("q")
        assert 0 == tmux.exit_status()
        wait_for(lambda: not any(alive(i) for i in seen), timeout=60, what="every demo process to stop")
        assert not home.exists()


class TestTuiCommand:
    def test_tui_waits_for_a_daemon_then_connects(self, tmux: Tmux, sandbox: Sandbox) -> None:
        """`vaultsim tui --home H` before any daemon: DISCONNECTED; once one starts: UNLOCKED; `q` exits 0."""
        tmux.start(f"{PY} -m vault.cli.main tui --home {sandbox.home}")
        wait_for(lambda: "DISCONNECTED" in tmux.screen(), timeout=60, what="the disconnected state")
        sandbox.start_daemon()
        wait_for(lambda: " UNLOCKED " in tmux.screen(), timeout=60, what="the TUI to connect")
        tmux.keys("q")
        assert 0 == tmux.exit_status()

    @pytest.mark.parametrize("sig", [2, 15])
    def test_a_signal_from_outside_ends_it_with_128_plus_the_signal(self, tmux: Tmux, sandbox: Sandbox,
                                                                     sig: int) -> None:
        """`kill -INT` / `kill -TERM` the TUI: it restores the terminal and exits 130 / 143, as a
        shell reports a command ended by that signal (it exited 0, as if `q` were pressed)."""
        pane = tmux.start(f"{PY} -m vault.cli.main tui --home {sandbox.home}")
        wait_for(lambda: "DISCONNECTED" in tmux.screen(), timeout=60, what="the TUI")
        tui = next(p for p in psutil.Process(pane).children(recursive=True) if "tui" in p.cmdline())
        os.kill(tui.pid, sig)
        assert 128 + sig == tmux.exit_status()
