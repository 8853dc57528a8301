"""Red-team pass over the pytest plugin: a plugin user's mistakes and a CI job that is cancelled.

Each test here failed before its fix:

    a positional mark argument        `@pytest.mark.vaultsim("dns_failure")` was ignored: the test
                                      ran in a healthy world and passed
    run_agent with a missing program  ran a "trial" of a program that never started, graded as the
    or an operation not in the        agent's FAIL_OUTCOME, where `vaultsim run` refuses the same
    catalog                           scenario before any trial (exit 2)
    an approver rule for an operation a typo matched nothing: every request fell to the default
    the catalog lacks                 denial and the test failed far from its cause
    --vaultsim-agent with a missing   every scenario item failed with a FileNotFoundError traceback
    program; --vaultsim-trials -1     (`vaultsim run --agent` refuses it, exit 2); a negative trial
                                      count crashed each item with an IndexError
    a bad world option                (a test name too long for a socket path under tmp_path) left
                                      the world's directory in /tmp
    an agent that prints a leaked     the failing test's `vaultsim` report section and any assertion
    credential (or the approver       on run.final / run.stdout printed it into the CI log (and the
    token it found)                   runner's own report printed a snooped approver token)
    an agent that double-forks a      in the agent jail (the default where bubblewrap works, for the
    process out of its group          plugin and `vaultsim run` alike) the jail's end killed it
                                      silently and the trial passed; without a jail the same agent
                                      is FAIL_DEADLINE
    SIGTERM to pytest                 (a CI job cancelled or timed out) killed the interpreter with
                                      the agent still running and the world's home left behind; a
                                      second signal must not cut that teardown short
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from helpers import ROOT, wait_for
from vault.errors import BadInput
from vault.jail.probe import problem
from vault.pytest_plugin.world import Vaultsim, VaultsimFactory, VaultsimFailure


def _write(pytester: pytest.Pytester, name: str, body: str) -> None:
    pytester.makepyfile(**{name: textwrap.dedent(body)})


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class TestUserMistakes:
    def test_positional_mark_argument_is_a_usage_error(self, pytester: pytest.Pytester) -> None:
        _write(pytester, "test_pos", """
            import pytest
            @pytest.mark.vaultsim("dns_failure")
            def test_x(vaultsim):
                pass
        """)
        out = pytester.runpytest_subprocess("-p", "no:cacheprovider")
        text = out.stdout.str() + out.stderr.str()
        assert "keyword options only" in text and "'dns_failure'" in text, text[-2000:]
        assert "1 passed" not in text

    def test_missing_program_is_bad_input_before_any_trial(self, vaultsim: Vaultsim, tmp_path: Path) -> None:
        with pytest.raises(BadInput, match=r"run_agent: field command: .*/no/such/agent.* not an executable"):
            vaultsim.run_agent([str(tmp_path / "no" / "such" / "agent")], task={"operations": ["read_issue"]})
        with pytest.raises(BadInput, match="no program 'vaultsim-no-such-agent' on PATH"):
            vaultsim.run_agent("vaultsim-no-such-agent --go", task={"operations": ["read_issue"]})
        assert [] == vaultsim.agents  # nothing ran, so nothing is graded against the agent

    def test_operation_not_in_the_catalog_is_bad_input(self, vaultsim: Vaultsim) -> None:
        with pytest.raises(BadInput, match=r"field operations\.0: unknown operation 'read_isue' "
                                           r"\(did you mean 'read_issue'\?\)"):
            vaultsim.run_agent("{python} -c pass", task={"operations": ["read_isue"]})
        with pytest.raises(BadInput, match=r"field steps\.0\.call: unknown operation 'delete_releas'"):
            vaultsim.run_agent("{python} -c pass", task={"operations": ["delete_release"], "steps": [
                {"call": "delete_releas", "params": {"release_id": "rel-1"}}]})
        with pytest.raises(BadInput, match=r"run_agent: step 0 \(read_issue\) names \$\{crate\.…\}, not an earlier step"):
            vaultsim.run_agent("{python} -c pass", task={"operations": ["read_issue"], "steps": [
                {"id": "read", "call": "read_issue", "params": {"issue_id": "${crate.id}"}}]})
        assert [] == vaultsim.agents

    def test_approver_rule_for_no_operation_is_bad_input(self, vaultsim: Vaultsim) -> None:
        with pytest.raises(BadInput, match=r"no operation matches 'create_isue' \(did you mean 'create_issue'\?\)"):
            vaultsim.approver.allow_once("create_isue")
        vaultsim.approver.deny("delete_*").allow_session("*")  # patterns that match something stay fine
        assert 2 == len(vaultsim.approver.rules)

    def test_bad_world_option_leaves_no_directory(self, vaultsim_engine: object) -> None:
        """A test path too deep for a socket puts the world in /tmp; a bad option removes it again."""
        factory = VaultsimFactory(vaultsim_engine, Path("/tmp") / ("d" * 100), "deep")  # type: ignore[arg-type]
        mine = f"vsp-{os.getpid()}-"
        before = {p.name for p in Path("/tmp").iterdir() if p.name.startswith(mine)}
        with pytest.raises(BadInput, match="fault"):
            factory(fault="no_such_fault")
        factory.close()
        assert before == {p.name for p in Path("/tmp").iterdir() if p.name.startswith(mine)}

    def test_bad_scenario_options_are_usage_errors(self, pytester: pytest.Pytester) -> None:
        (pytester.path / "sc.yaml").write_text("agents: [{plan: {steps: []}}]\nexpect: {verdict: PASS}\n")
        for args, said in ((["--vaultsim-agent", "vaultsim-no-such-agent --x"],
                            "--vaultsim-agent: no program 'vaultsim-no-such-agent' on PATH"),
                           (["--vaultsim-trials=-1"], "--vaultsim-trials -1: at least 1")):
            out = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vaultsim-scenarios", *args)
            text = out.stdout.str() + out.stderr.str()
            assert said in text and "Traceback" not in text, text[-2000:]
            assert out.ret == pytest.ExitCode.USAGE_ERROR


@pytest.mark.skipif(problem() is not None, reason=f"no jail here: {problem()}")
def test_a_process_left_outside_the_group_in_the_jail_is_named(vaultsim: Vaultsim) -> None:
    """tests/agents/leaves_grandchild.py does its step and leaves a setsid grandchild: in the jail,
    as without one, the grade is FAIL_DEADLINE naming it, and the process is gone."""
    import uuid
    marker = f"vaultsim-left-{uuid.uuid4().hex}"
    run = vaultsim.run_agent([sys.executable, str(ROOT / "tests" / "agents" / "leaves_grandchild.py"), marker],
                             task={"operations": ["read_issue"],
                                   "steps": [{"id": "r", "call": "read_issue", "params": {"issue_id": "ISS-1"}}]},
                             isolation="bwrap")
    assert run.final.startswith("done") and ["success"] == run.categories
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
    with pytest.raises(VaultsimFailure) as failure:
        vaultsim.assert_verdict("PASS")
    assert "FAIL_DEADLINE" in str(failure.value)
    assert "left 1 process(es) running outside its process group" in str(failure.value)


class TestLeakedValueStaysOutOfTheLog:
    def test_failing_test_prints_no_leaked_credential(self, pytester: pytest.Pytester) -> None:
        """An agent handed a credential (a harness anti-pattern) prints it on stdout, stderr and as
        its final message; the test fails on its final message. pytest's whole output names the
        leak (FAIL_SECRET_LEAK) and shows the agent's words, but never the value."""
        record = pytester.path / "secret.txt"
        _write(pytester, "test_leaky", f"""
            import sys
            AGENT = ("import os, sys; v = os.environ['LEAK']; print('log', v); "
                     "print('err', v, file=sys.stderr); print('done: ' + v)")
            def test_leaky_final(vaultsim):
                secret = vaultsim.live.world.secrets["tracker_token"]
                open({str(record)!r}, "w").write(secret)
                run = vaultsim.run_agent([sys.executable, "-c", AGENT], env={{"LEAK": secret}},
                                         task={{"operations": ["read_issue"]}})
                assert "[redacted]" in run.stdout and "[redacted]" in run.stderr
                assert run.final == "done: nothing", run
            def test_leaky_verdict(vaultsim):
                secret = vaultsim.live.world.secrets["tracker_token"]
                vaultsim.run_agent([sys.executable, "-c", AGENT], env={{"LEAK": secret}},
                                   task={{"operations": ["read_issue"]}})
                vaultsim.assert_verdict("PASS")
            def test_snooped_approver_token(vaultsim):
                token = (vaultsim.home / "approver.token").read_text().strip()
                open({str(record)!r} + ".token", "w").write(token)
                snoop = ("import os; home = os.path.dirname(os.environ['VAULTSIM_SOCKET']); "
                         "print('done: ' + open(os.path.join(home, 'approver.token')).read().strip())")
                run = vaultsim.run_agent([sys.executable, "-c", snoop], task={{"operations": ["read_issue"]}},
                                         isolation="none")
                assert run.final == "done: nothing", run
        """)
        out = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
        out.assert_outcomes(failed=3)
        text = out.stdout.str() + out.stderr.str()
        secret, token = record.read_text(), Path(str(record) + ".token").read_text()
        assert "final 'done: [redacted]'" in text and "FAIL_SECRET_LEAK" in text
        assert "AgentResult(name='python', exit_code=0, final='done: [redacted]'" in text
        assert secret not in text and token not in text


AGENT = """
import os, sys, time
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_terminated_run_leaves_nothing(pytester: pytest.Pytester, sig: signal.Signals) -> None:
    """pytest stopped mid-test (CI cancel or timeout: SIGTERM; Ctrl-C: SIGINT) while an agent runs:
    the agent, the daemon and the world's home are gone when pytest has exited."""
    record = pytester.path / "record"
    agent_file = pytester.path / "agent.py"
    agent_file.write_text(AGENT)
    _write(pytester, "test_hang", f"""
        import json, sys
        def test_hang(vaultsim):
            world = {{"root": str(vaultsim.live.root), "daemon": vaultsim.live.world.daemon.pid}}
            open({str(record)!r} + ".world", "w").write(json.dumps(world))
            vaultsim.run_agent([sys.executable, {str(agent_file)!r}, {str(record)!r} + ".agent"],
                               task={{"operations": ["read_issue"], "deadline_s": 100}}, isolation="none")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VAULTSIM_")}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_hang.py"],
                            cwd=pytester.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        agent_pid = int(wait_for(lambda: (record.parent / "record.agent").is_file()
                                 and (record.parent / "record.agent").read_text(), timeout=60, what="agent started"))
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    world = json.loads((record.parent / "record.world").read_text())
    assert proc.returncode != 0, out
    assert not Path(world["root"]).exists(), out[-2000:]
    assert not _alive(agent_pid), out[-2000:]
    wait_for(lambda: not _alive(world["daemon"]), timeout=10, what="daemon gone")


def test_a_second_signal_does_not_cut_the_teardown_short() -> None:
    """CI sends SIGINT or SIGTERM, then SIGTERM again a few seconds later: the first ends the run
    (teardown starts), a later one is ignored so that teardown finishes."""
    from vault.pytest_plugin.plugin import Interrupt
    handler = Interrupt()
    with pytest.raises(KeyboardInterrupt, match="SIGTERM: ending every world"):
        handler(signal.SIGTERM, None)
    handler(signal.SIGTERM, None)
    handler(signal.SIGHUP, None)
