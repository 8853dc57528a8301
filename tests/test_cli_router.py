"""The `vaultsim` command line as a user meets it: --version, help, exit codes, hints, --json, completion."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

import vault
from helpers import PY, ROOT, Sandbox
from vault.cli.main import ACTION_EXAMPLES, COMMANDS, _resolve, command_parser, main


def vaultsim(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "vault.cli.main", *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=env)


def _actions() -> list[str]:
    """Every `COMMAND ACTION` the parsers define (argparse keeps sub-commands only in `_actions`)."""
    found = []
    for name in COMMANDS:
        parser = command_parser(name, _resolve(name)[0])
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found += [f"{name} {sub}" for sub in action.choices]
    return found


class TestTopLevel:
    def test_version(self) -> None:
        out = vaultsim("--version")
        assert (0, f"vaultsim {vault.__version__}\n") == (out.returncode, out.stdout)

    def test_help_lists_commands_and_the_exit_codes(self) -> None:
        out = vaultsim("--help")
        assert 0 == out.returncode
        for name in COMMANDS:
            assert f"\n  {name} " in out.stdout
        for line in ("0    done", "1    the command's negative answer", "2    bad input or usage",
                     "3    internal or infrastructure error", "5    nothing selected"):
            assert line in out.stdout

    def test_no_command_is_a_usage_error(self) -> None:
        out = vaultsim()
        assert 2 == out.returncode and "usage: vaultsim" in out.stderr

    def test_unknown_command(self) -> None:
        out = vaultsim("sttaus")
        assert 2 == out.returncode and "invalid choice: 'sttaus'" in out.stderr

    def test_an_option_before_the_command_is_named(self) -> None:
        """`vaultsim --home D status`: the option is named, not "COMMAND is required"."""
        out = vaultsim("--home", "/tmp/x", "status")
        assert 2 == out.returncode
        assert "vaultsim: error: unrecognized option '--home' before the command; a command's options go after " \
               "it: vaultsim COMMAND --home ...\n" == out.stderr.splitlines(keepends=True)[-1]

    @pytest.mark.parametrize("name", list(COMMANDS))
    def test_every_command_has_help_with_an_example(self, name: str) -> None:
        if name == "mcp":
            pytest.importorskip("mcp")
        out = vaultsim(name, "--help")
        assert 0 == out.returncode, out.stderr
        assert f"example:\n  {COMMANDS[name].example}" in out.stdout

    @pytest.mark.parametrize("action", _actions())
    def test_every_action_has_help_with_an_example(self, action: str) -> None:
        """Each action of each command (`secret set`, `report merge`, ...), found in the parsers."""
        out = vaultsim(*action.split(), "--help")
        assert 0 == out.returncode, out.stderr
        assert f"example:\n  {ACTION_EXAMPLES.get(action)}" in out.stdout

    @pytest.mark.parametrize("name", ["tui", "demo"])
    def test_the_approver_app_without_a_terminal_is_refused(self, name: str) -> None:
        """`vaultsim tui </dev/null` (a CI step, a pipe): exit 2 at once, not an app drawing into
        a file and waiting forever for keys."""
        out = subprocess.run([PY, "-m", "vault.cli.main", name], stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=60, cwd=ROOT)
        assert (2, "") == (out.returncode, out.stdout)
        assert out.stderr.startswith(f"vaultsim {name}: needs a terminal on stdin and stderr;")

    def test_a_bug_exits_3_with_its_traceback(self, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
        """An unexpected exception is an internal error (pytest's 3), said plainly, traceback kept."""
        import vault.cli.schema

        def broken(args: Any) -> int:
            raise ZeroDivisionError("a bug")
        monkeypatch.setattr(vault.cli.schema, "run", broken)
        assert 3 == main(["schema", "result"])
        err = capsys.readouterr().err
        assert "ZeroDivisionError: a bug" in err and "vaultsim schema: internal error" in err

    def test_ctrl_c_while_the_command_loads_exits_130_quietly(self, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
        """A Ctrl-C that lands while a command's modules import (the first half second of
        `vaultsim run`) is an interrupt like any other: 130, and no traceback on the terminal."""
        import vault.cli.main as cli

        def interrupted(name: str) -> Any:
            raise KeyboardInterrupt
        monkeypatch.setattr(cli, "_resolve", interrupted)
        assert 130 == main(["run", "scenarios/"])
        assert "Traceback" not in capsys.readouterr().err

    @pytest.mark.parametrize("argv", [["status", "--json"], ["secret", "list", "--json"],
                                      ["audit", "verify", "--json"], ["stats", "--json"]])
    def test_ctrl_c_while_the_command_loads_still_prints_its_json(self, argv: list[str],
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
        """Under `--json` a script parsing stdout gets a document on a Ctrl-C during the import too
        (it got none: the modules that declare the switch had not loaded)."""
        import vault.cli.main as cli

        def interrupted(name: str) -> Any:
            raise KeyboardInterrupt
        monkeypatch.setattr(cli, "_resolve", interrupted)
        assert 130 == main(argv)
        assert {"error": "interrupted (Ctrl-C)", "exit_code": 130} == json.loads(capsys.readouterr().out)

    def test_a_run_whose_json_is_a_file_prints_no_document_on_ctrl_c(self, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
        import vault.cli.main as cli

        def interrupted(name: str) -> Any:
            raise KeyboardInterrupt
        monkeypatch.setattr(cli, "_resolve", interrupted)
        assert 130 == main(["run", "--json", "report.json"])
        assert "" == capsys.readouterr().out

    @pytest.mark.parametrize("name", sorted(COMMANDS))
    def test_the_json_switch_known_before_loading_is_the_parsers(self, name: str) -> None:
        """`Command.json_switch` (read before a command's modules load) says what its parser says."""
        import vault.cli.main as cli
        try:
            parser = command_parser(name, _resolve(name)[0])
        except ImportError as exc:  # an optional extra not installed here
            pytest.skip(str(exc))
        assert COMMANDS[name].json_switch == cli._json_flag(parser)


class TestInterrupt:
    def test_ctrl_c_ends_the_scripted_approver_with_130(self, sandbox: Sandbox) -> None:
        """Ctrl-C is an interrupt (130), not the daemon going away (0, "daemon closed the connection")."""
        sandbox.start_daemon()
        proc = sandbox.start_approver([{"match": {}, "decide": "deny"}])
        proc.send_signal(signal.SIGINT)
        assert 130 == proc.wait(timeout=30)
        assert "daemon closed" not in (sandbox.root / "approver.stderr").read_text()


class TestOptionValues:
    def test_exec_paths_of_the_wrong_kind_are_bad_input(self, tmp_path: Path) -> None:
        """--workdir a file, --task a directory: exit 2 naming the option, before any daemon is asked
        (was: the jail failing with exit 127 and a NotADirectoryError, or a directory bound as the task)."""
        (tmp_path / "f").write_text("x")
        for option, path, kind in (("--workdir", tmp_path / "f", "a directory"),
                                   ("--task", tmp_path, "a regular file")):
            out = vaultsim("exec", "--home", str(tmp_path / "h"), option, str(path), "--", "true")
            assert (2, f"vaultsim exec: {option}: {path} is not {kind}\n") == (out.returncode, out.stderr)

    def test_exec_workdir_holds_without_the_jail(self, sandbox: Sandbox, tmp_path: Path) -> None:
        """`--isolation none --workdir D`: the program runs in D, as it does in the jail."""
        sandbox.start_daemon()
        out = sandbox.vaultsim("exec", "--isolation", "none", "--workdir", str(tmp_path), "--", "pwd")
        assert (0, f"{tmp_path}\n") == (out.returncode, out.stdout), out.stderr

    @pytest.mark.parametrize("value", ["-1", "nan", "soon"])
    def test_stats_rubber_stamp_seconds_are_checked_here(self, tmp_path: Path, value: str) -> None:
        """A bad --rubber-stamp-s is a usage error (2), not the daemon's refusal (1)."""
        out = vaultsim("stats", "--home", str(tmp_path / "h"), "--rubber-stamp-s", value)
        assert 2 == out.returncode and f"argument --rubber-stamp-s: '{value}'" in out.stderr


class TestNoDaemon:
    @pytest.mark.parametrize("argv", [["lock"], ["unlock"], ["stats"], ["unlock", "--json"]])
    def test_an_error_that_needs_a_daemon_says_how_to_start_one(self, tmp_path: Path, argv: list[str]) -> None:
        home = tmp_path / "h"
        out = vaultsim(*argv, "--home", str(home))
        assert 1 == out.returncode
        assert f"hint: no daemon serves {home}; start one with `vaultsim daemon --home {home}`" in out.stderr
        # with --json the error is a JSON object on stdout too (a script parsing stdout gets one)
        if "--json" in argv:
            assert "start one with `vaultsim daemon" in json.loads(out.stdout)["hint"]
        else:
            assert "" == out.stdout

    @pytest.mark.parametrize("argv", [["lock"], ["unlock", "--json"], ["stats"], ["stop"], ["exec", "--", "true"],
                                      ["diag", "show", "d-0"]])
    def test_a_home_that_is_a_file_is_bad_input_not_a_traceback(self, tmp_path: Path, argv: list[str]) -> None:
        """VAULTSIM_HOME naming a regular file: exit 2 with the reason, no traceback, nothing on stdout
        (under --json, the error's JSON object)."""
        (tmp_path / "h").write_text("not a directory")
        out = vaultsim(*argv, env={**os.environ, "VAULTSIM_HOME": str(tmp_path / "h")})
        if "--json" in argv:
            assert {"error": f"vault home {tmp_path / 'h'} exists and is not a directory", "exit_code": 2} \
                == json.loads(out.stdout)
        else:
            assert "" == out.stdout
        assert 2 == out.returncode, out.stderr
        assert f"vaultsim {argv[0]}: vault home {tmp_path / 'h'} exists and is not a directory\n" == out.stderr

    def test_stop_with_nothing_to_stop_says_so_on_stderr(self, tmp_path: Path) -> None:
        out = vaultsim("stop", "--home", str(tmp_path / "h"))
        assert (1, "", f"vaultsim stop: no daemon serves {tmp_path / 'h'}\n") == \
            (out.returncode, out.stdout, out.stderr)

    def test_exec_says_no_daemon_once_then_how_to_start_one(self, tmp_path: Path) -> None:
        home = tmp_path / "h"
        out = vaultsim("exec", "--home", str(home), "--", "true")
        assert 1 == out.returncode
        assert [f"vaultsim exec: no vault daemon serves {home} (no agent.sock)",
                f"hint: no daemon serves {home}; start one with `vaultsim daemon --home {home}` "
                "(add --unlocked to skip `vaultsim unlock`)"] == out.stderr.splitlines()

    def test_the_hint_names_the_home_from_the_environment(self, tmp_path: Path) -> None:
        env = {**os.environ, "VAULTSIM_HOME": str(tmp_path / "h")}
        out = vaultsim("lock", env=env)
        assert f"hint: no daemon serves {tmp_path / 'h'}; start one with `vaultsim daemon` " in out.stderr

    def test_no_hint_when_a_daemon_runs(self, sandbox: Sandbox) -> None:
        """A refusal from a running daemon is not blamed on a missing one."""
        sandbox.start_daemon(unlocked=True)
        (sandbox.home / "approver.token").write_text("wrong-token\n")
        out = sandbox.vaultsim("lock")
        assert 1 == out.returncode
        assert "hint:" not in out.stderr


class TestPipesAndExtras:
    @pytest.mark.parametrize("argv", [["schema", "report"], ["completion", "bash"], ["status", "--json"],
                                      ["secret", "list", "--json"], ["--help"]],
                             ids=["schema", "completion", "status", "secret-list", "help"])
    def test_a_reader_that_left_ends_the_command_quietly(self, tmp_path: Path, argv: list[str]) -> None:
        """`vaultsim ... | head -1`: stdout's reader is gone before anything is written; the command
        stops without a traceback (exit 1, as `run`'s rich console does; `--help` is done: 0)."""
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            out = subprocess.run([PY, "-m", "vault.cli.main", *argv], stdout=write_end, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL, text=True, timeout=60, cwd=ROOT,
                                 env={**os.environ, "VAULTSIM_HOME": str(tmp_path / "h")})
        finally:
            os.close(write_end)
        assert ("", 0 if argv == ["--help"] else 1) == (out.stderr, out.returncode)

    @pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
    @pytest.mark.parametrize("argv", [["schema", "report"], ["status", "--json"]], ids=["schema", "status"])
    def test_no_room_for_stdout_is_one_line_not_a_bug(self, tmp_path: Path, argv: list[str]) -> None:
        """stdout on a full disk: an infrastructure error (3) in one line, no traceback blaming vaultsim."""
        with open("/dev/full", "w") as full:
            out = subprocess.run([PY, "-m", "vault.cli.main", *argv], stdout=full, stderr=subprocess.PIPE,
                                 text=True, timeout=60, env={**os.environ, "VAULTSIM_HOME": str(tmp_path / "h")})
        assert (3, f"vaultsim {argv[0]}: cannot write: No space left on device\n") == (out.returncode, out.stderr)

    def test_no_stdin_or_stdout_at_all(self, tmp_path: Path) -> None:
        """Started with fd 0 or 1 closed (`<&-`, `>&-`; Python then has no sys.stdin/stdout): a
        missing value is bad input, a missing stdout swallows the output; never a traceback."""
        def closed(redirect: str, *argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["sh", "-c", f'exec "$@" {redirect}', "sh", PY, "-m", "vault.cli.main", *argv],
                                  capture_output=True, text=True, timeout=60,
                                  env={**os.environ, "VAULTSIM_HOME": str(tmp_path / "h")})
        unset = closed("<&-", "secret", "set", "x")
        assert 2 == unset.returncode and unset.stderr.startswith("vaultsim secret: empty value:"), unset.stderr
        quiet = closed(">&-", "status")
        assert (1, "") == (quiet.returncode, quiet.stderr)

    BLOCK = "import sys; sys.modules.update(dict.fromkeys(['mcp', 'anyio'], None)); "

    def test_mcp_help_and_refusal_without_the_extra(self) -> None:
        """Without `vaultsim[mcp]` (no mcp SDK, no anyio): `mcp --help` works, `mcp` says what to install."""
        def mcp(*args: str) -> subprocess.CompletedProcess[str]:
            code = self.BLOCK + f"from vault.cli.main import main; sys.exit(main(['mcp', *{list(args)!r}]))"
            return subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
        helped = mcp("--help")
        assert 0 == helped.returncode, helped.stderr
        assert f"example:\n  {COMMANDS['mcp'].example}" in helped.stdout
        refused = mcp()
        assert (2, "vaultsim mcp: the MCP bridge needs the mcp SDK: pip install 'vaultsim[mcp]'\n") == \
            (refused.returncode, refused.stderr)

    def test_completion_without_the_mcp_extra(self, tmp_path: Path) -> None:
        """Shell completion builds every command's parser: a missing extra must not break it."""
        answer = tmp_path / "completions"
        env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": "vaultsim st", "COMP_POINT": "11",
               "_ARGCOMPLETE_STDOUT_FILENAME": str(answer)}
        code = self.BLOCK + "from vault.cli.main import main; main()"
        out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
        assert 0 == out.returncode, out.stderr
        assert {"stats", "status", "stop"} == {w.strip() for w in answer.read_text().split()}


class TestStatusExitCodes:
    """Like `vault status`: 0 unlocked, 1 not running, 2 locked, with --json as well."""

    def test_not_running_locked_unlocked(self, sandbox: Sandbox) -> None:
        out = sandbox.vaultsim("status", "--json")
        assert (1, False) == (out.returncode, json.loads(out.stdout)["running"])
        started = sandbox.vaultsim("daemon", "--json", check=True)
        info = json.loads(started.stdout)
        assert (True, True, str(sandbox.home)) == (info["running"], info["locked"], info["home"])
        assert info["agent_socket"] == str(sandbox.agent_sock) and info["pid"] > 0
        out = sandbox.vaultsim("status", "--json")
        assert (2, True) == (out.returncode, json.loads(out.stdout)["locked"])
        unlocked = sandbox.vaultsim("unlock", "--json")
        assert (0, {"locked": False}) == (unlocked.returncode, json.loads(unlocked.stdout))
        out = sandbox.vaultsim("status")
        assert 0 == out.returncode and "locked: False" in out.stdout
        locked = sandbox.vaultsim("lock", "--json")
        assert (0, {"locked": True, "pending_denied": 0, "grants_ended": 0}) == \
            (locked.returncode, json.loads(locked.stdout))
        assert 2 == sandbox.vaultsim("status").returncode
        assert 0 == sandbox.vaultsim("stop").returncode
        assert 1 == sandbox.vaultsim("status").returncode

    def test_status_says_why_no_daemon_can_serve_a_home(self, tmp_path: Path) -> None:
        """A home that is a file: still "not running" (1), and why none could run there."""
        (tmp_path / "h").write_text("not a directory")
        why = f"vault home {tmp_path / 'h'} exists and is not a directory"
        out = vaultsim("status", "--home", str(tmp_path / "h"))
        assert (1, f"  and none can: {why}") == (out.returncode, out.stdout.splitlines()[1])
        out = vaultsim("status", "--json", "--home", str(tmp_path / "h"))
        assert (1, False, why) == (out.returncode, *map(json.loads(out.stdout).get, ("running", "home_unusable")))

    def test_status_help_documents_the_codes(self) -> None:
        assert "exit: 0 running and unlocked, 1 no daemon running, 2 running but locked" in \
            vaultsim("status", "--help").stdout

    @pytest.mark.parametrize("flag", ["--policy", "--catalog", "--config"])
    def test_a_fifo_for_the_detached_daemon_is_refused(self, tmp_path: Path, flag: str) -> None:
        """The detached daemon would wait on the FIFO forever (its parent gave up after 20 s)."""
        fifo = tmp_path / "p.yaml"
        os.mkfifo(fifo)
        out = vaultsim("daemon", "--home", str(tmp_path / "h"), flag, str(fifo))
        assert (2, f"vaultsim daemon: {flag}: {fifo} is not a regular file\n") == (out.returncode, out.stderr)

    def test_a_daemon_that_never_comes_up_is_stopped(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
        """The parent gives up on a child that hangs before serving: it ends it, so no daemon comes
        up later to hold the home after the user was told it failed."""
        import psutil
        from vault.cli import daemon as daemon_cli
        hang = tmp_path / "hang"
        hang.mkdir()
        (hang / "sitecustomize.py").write_text("import signal\nsignal.pause()\n")  # hangs at start-up
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hang), os.environ.get("PYTHONPATH")])))
        monkeypatch.setattr(daemon_cli, "_START_TIMEOUT_S", 1.0)
        home = tmp_path / "h"
        assert 1 == main(["daemon", "--home", str(home)])
        assert "vaultsim daemon: did not come up in time (stopped it)" in capsys.readouterr().err
        left = [p.pid for p in psutil.process_iter(["cmdline"]) if str(home) in " ".join(p.info["cmdline"] or [])]
        assert [] == left

    def test_daemon_json_with_foreground_is_refused(self, tmp_path: Path) -> None:
        out = vaultsim("daemon", "--foreground", "--json", "--home", str(tmp_path / "h"))
        assert 2 == out.returncode and "--json reports a background start" in out.stderr


class TestSchemas:
    @pytest.mark.parametrize("which", ["report", "scenario", "policy", "catalog", "result"])
    def test_each_schema_is_valid(self, which: str) -> None:
        import jsonschema
        out = vaultsim("schema", which)
        assert 0 == out.returncode, out.stderr
        schema = json.loads(out.stdout)
        jsonschema.validators.validator_for(schema).check_schema(schema)

    def test_shipped_files_validate_against_their_schemas(self) -> None:
        """Every shipped scenario, policy and the catalog fit the schemas editors will check them with."""
        import jsonschema
        import yaml
        from vault.resources import SCENARIOS
        from vault.cli.schema import schema
        checked = 0
        for which, files in (("scenario", [p for p in SCENARIOS.glob("*.yaml") if p.name != "catalog.yaml"]),
                             ("policy", list(SCENARIOS.glob("policies/*.yaml"))),
                             ("catalog", [SCENARIOS / "catalog.yaml"])):
            for path in files:
                jsonschema.validate(yaml.safe_load(path.read_text()), schema(which))
                checked += 1
        assert checked > 10

    def test_a_typo_in_a_scenario_fails_the_schema(self) -> None:
        import jsonschema
        from vault.cli.schema import schema
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"agents": [{"plan": "p.yaml"}], "expect": {"verdict": "PASS"}, "trails": 3},
                                schema("scenario"))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
class TestCompletion:
    def complete(self, line: str) -> list[str]:
        """Ask bash, with the script `vaultsim completion bash` prints, for the completions of `line`."""
        vaultsim_bin = Path(PY).with_name("vaultsim")
        script = f"""
            eval "$({vaultsim_bin} completion bash)"
            vaultsim() {{ {vaultsim_bin} "$@"; }}
            COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}
            read -ra COMP_WORDS <<< "$COMP_LINE"; [[ "$COMP_LINE" == *' ' ]] && COMP_WORDS+=('')
            COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
            _python_argcomplete vaultsim "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
            printf '%s\\n' "${{COMPREPLY[@]}}"
        """
        env = {**os.environ, "PATH": f"{vaultsim_bin.parent}:{os.environ.get('PATH', '')}"}
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, env=env)
        assert 0 == out.returncode, out.stderr
        return sorted(x.strip() for x in out.stdout.splitlines() if x.strip())

    def test_commands(self) -> None:
        if not Path(PY).with_name("vaultsim").exists():
            pytest.skip("no vaultsim console script beside this interpreter")
        assert {"stats", "status", "stop"} == set(self.complete("vaultsim st"))

    def test_options_of_a_command(self) -> None:
        if not Path(PY).with_name("vaultsim").exists():
            pytest.skip("no vaultsim console script beside this interpreter")
        assert {"--color", "--exitfirst"} <= set(self.complete("vaultsim run --"))
        assert {"report", "scenario", "policy", "catalog", "result"} <= set(self.complete("vaultsim schema "))

    @pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
    def test_each_shell_gets_a_script(self, shell: str) -> None:
        out = vaultsim("completion", shell)
        assert 0 == out.returncode and "vaultsim" in out.stdout and len(out.stdout) > 200


def test_a_ctrl_c_a_library_wrapped_is_an_interrupt() -> None:
    """pydantic turns a KeyboardInterrupt raised while it builds a schema into its own error: the
    command still ends as interrupted (130), with no traceback and no "internal error"."""
    from vault.cli.main import _interrupted

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as kbi:
            raise RuntimeError("schema build failed") from kbi
    except RuntimeError as wrapped:
        assert _interrupted(wrapped)
    assert not _interrupted(RuntimeError("a bug"))
