"""The gate with real daemons, real scripted approvers and fresh agent processes."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, Sandbox, remote_events, remote_ledger, wait_for
from vault.client import ApproverClient
from vault.home import VaultHome
from vault.daemon.peer import ProcessIdentity
from vault.daemon.sessions import SessionTable

TOKEN = "tracker-token-value"


def setup(sandbox: Sandbox, *daemon_args: str, unlocked: bool = True) -> str:
    """Remote + credentials + daemon pointed at it; returns the remote URL."""
    _, url = sandbox.start_remote({"tracker_token": TOKEN, "releases_token": TOKEN})
    sandbox.set_secret("tracker_token", TOKEN)
    sandbox.set_secret("releases_token", TOKEN)
    sandbox.start_daemon("--remote", url, *daemon_args, unlocked=unlocked)
    return url


def stats(sandbox: Sandbox, run_id: str = "run-1") -> dict[str, Any]:
    out = sandbox.vaultsim("stats", "--json", "--run", run_id, check=True)
    return json.loads(out.stdout)["runs"].get(run_id, {"prompts": 0})


def agent_script(sandbox: Sandbox, body: str, *args: str, run_id: str = "run-1",
                 wait: bool = True) -> Any:
    """Run Python as a fresh agent process with `client` (an AgentClient) in scope."""
    code = (
        "import json, os, sys\n"
        "from vault.client import AgentClient\n"
        "client = AgentClient(os.environ['VAULTSIM_SOCKET'], timeout=60)\n"
        "def out(x): print(json.dumps(x.model_dump(mode='json') if hasattr(x, 'model_dump') else x), flush=True)\n"
        + body
    )
    env = {**sandbox.env, "VAULTSIM_SOCKET": str(sandbox.agent_sock), "VAULTSIM_RUN_ID": run_id}
    argv = [PY, "-c", code, *args]
    if not wait:
        return sandbox.spawn(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith(("{", "["))]


CREATE = {"call": "create_issue", "params": {"title": "flaky test"}}
DELETE = {"call": "delete_release", "params": {"release_id": "r-1"}}


class TestSessionGrant:
    def test_session_grant_covers_one_process_only(self, sandbox: Sandbox) -> None:
        """First create prompts once, the second not; a new process is prompted again (one more)."""
        setup(sandbox)
        sandbox.start_approver([{"match": {"operation": "create_issue"}, "decide": "allow_session"}])
        run = sandbox.run_agent([CREATE, CREATE])
        assert [r["category"] for r in run.results] == ["success", "success"]
        assert stats(sandbox)["prompts"] == 1
        again = sandbox.run_agent([CREATE])
        assert [r["category"] for r in again.results] == ["success"]
        s = stats(sandbox)
        assert s["prompts"] == 2
        assert s["scopes_asked"] == {"create_issue on tracker": 2}
        assert s["repeated_scope_prompts"] == 1  # asked again for a scope granted to the first process

    def test_grant_ends_when_revoked(self, sandbox: Sandbox) -> None:
        """After `revoke` of the session's grants the next call prompts again."""
        setup(sandbox)
        sandbox.start_approver([{"match": {}, "decide": "allow_session"}])
        body = (
            "client.open_session('stub', 'run-1')\n"
            "out(client.call('create_issue', {'title': 'a'}))\n"
            "print(json.dumps({'sid': client.session_id}), flush=True)\n"
            "sys.stdin.readline()\n"
            "out(client.call('create_issue', {'title': 'b'}))\n"
        )
        proc = agent_script(sandbox, body, wait=False)
        first = json.loads(proc.stdout.readline())
        sid = json.loads(proc.stdout.readline())["sid"]
        assert first["category"] == "success"
        assert stats(sandbox)["prompts"] == 1
        with ApproverClient.for_home(VaultHome(sandbox.home), "test") as c:
            assert c.request("revoke", session_id=sid)["revoked"] == 1
        out, _ = proc.communicate("\n", timeout=60)
        assert json.loads(out.splitlines()[0])["category"] == "success"
        assert stats(sandbox)["prompts"] == 2


class TestProcessBinding:
    def test_new_process_with_old_session_id_is_refused(self, sandbox: Sandbox) -> None:
        """A fresh process presenting a live session id of another process gets authorization_denied."""
        setup(sandbox)
        holder = agent_script(sandbox, (
            "client.open_session('stub', 'run-1')\n"
            "print(json.dumps({'sid': client.session_id}), flush=True)\n"
            "sys.stdin.readline()\n"), wait=False)
        sid = json.loads(holder.stdout.readline())["sid"]
        thief = agent_script(sandbox, (
            "client.session_id = sys.argv[1]\n"
            "out(client.call('read_issue', {'issue_id': 'ISS-1'}))\n"), sid)
        assert thief[0]["category"] == "authorization_denied"
        assert thief[0]["retry"] == "never"
        assert f"belongs to process {holder.pid}" in thief[0]["message"]
        assert "open your own session" in thief[0]["message"]
        holder.communicate("\n", timeout=30)
        # after the owner exits the session is gone altogether
        wait_for(lambda: sandbox.status()["sessions"] == 0, what="session to end with its process")
        late = agent_script(sandbox, "client.session_id = sys.argv[1]\nout(client.call('read_issue', {'issue_id': 'ISS-1'}))\n", sid)
        assert late[0]["category"] == "authorization_denied"
        assert "unknown or closed session" in late[0]["message"]

    def test_child_using_parent_session_is_refused(self, sandbox: Sandbox) -> None:
        """A child process presenting its parent's session id is refused; its own session works."""
        setup(sandbox)
        results = agent_script(sandbox, (
            "import subprocess\n"
            "client.open_session('stub', 'run-1')\n"
            "child = ('import json,os,sys\\nfrom vault.client import AgentClient\\n'\n"
            "  'c = AgentClient(os.environ[\"VAULTSIM_SOCKET\"]); c.session_id = sys.argv[1]\\n'\n"
            "  'print(c.call(\"read_issue\", {\"issue_id\": \"ISS-1\"}).to_json())\\n'\n"
            "  'c.open_session(\"stub-child\", \"run-1\")\\n'\n"
            "  'print(c.call(\"read_issue\", {\"issue_id\": \"ISS-1\"}).to_json())\\n')\n"
            "res = subprocess.run([sys.executable, '-c', child, client.session_id], capture_output=True, text=True)\n"
            "for line in res.stdout.splitlines(): print(line)\n"))
        assert results[0]["category"] == "authorization_denied"
        assert "belongs to process" in results[0]["message"]
        assert results[1]["category"] == "success"

    def test_reused_pid_with_other_create_time_owns_nothing(self) -> None:
        """Same pid, different create_time: not the same process, so not the session's owner."""
        table = SessionTable()
        original = ProcessIdentity(pid=4121, uid=1000, create_time=100.0, exe="/usr/bin/python3")
        s = table.open("stub", "run-1", original, "k-1")
        successor = ProcessIdentity(pid=4121, uid=1000, create_time=250.0, exe="/usr/bin/python3")
        owner, why = table.check(s.id, successor)
        assert owner is None
        assert "belongs to process 4121" in why
        assert table.check(s.id, original)[0] is s


class TestPerCall:
    def test_per_call_prompts_every_time_even_after_allow_session(self, sandbox: Sandbox) -> None:
        """delete_release is per_call: allow_session acts as allow_once; each call prompts."""
        url = setup(sandbox)
        sandbox.start_approver([{"match": {"operation": "delete_release"}, "decide": "allow_session"}])
        run = sandbox.run_agent([DELETE, {"call": "delete_release", "params": {"release_id": "r-2"}}])
        assert [r["category"] for r in run.results] == ["success", "success"]
        s = stats(sandbox)
        assert s["prompts"] == 2
        assert s["destructive_session_grants"] == 0
        assert s["decisions"] == {"allow_once": 2}


class TestLock:
    def test_locked_vault_refuses_without_prompt(self, sandbox: Sandbox) -> None:
        """Started locked: vault_locked, retry after_unlock, zero prompts, nothing sent."""
        url = setup(sandbox, unlocked=False)
        sandbox.start_approver([{"match": {}, "decide": "allow_once"}])
        run = sandbox.run_agent([CREATE])
        assert run.results[0]["category"] == "vault_locked"
        assert run.results[0]["retry"] == "after_unlock"
        s = stats(sandbox)
        assert s["prompts"] == 0 and s["locked_refusals"] == 1
        assert remote_events(url) == []
        assert sandbox.vaultsim("unlock").returncode == 0
        assert sandbox.run_agent([CREATE]).results[0]["category"] == "success"

    def test_lock_settles_pending_and_refuses_late_decision(self, sandbox: Sandbox) -> None:
        """Lock while a request is pending: the agent gets approval_denied; a later decide is refused."""
        url = setup(sandbox)
        sandbox.start_approver([{"match": {}, "decide": "ignore"}])
        agent = agent_script(sandbox, "client.open_session('stub', 'run-1')\nout(client.call('create_issue', {'title': 'x'}))\n", wait=False)
        home = VaultHome(sandbox.home)
        with ApproverClient.for_home(home, "human") as c:
            wait_for(lambda: c.request("status")["pending"] == 1, what="pending request")
            rid = None
            # the request id comes from a subscription snapshot
            with ApproverClient.for_home(home, "peek") as p:
                rid = p.request("subscribe")["pending"][0]["request_id"]
            c.request("lock")
            out, _ = agent.communicate(timeout=30)
            result = json.loads(out.splitlines()[0])
            assert result["category"] == "approval_denied"
            assert "locked" in result["message"]
            from vault.errors import RpcError
            with pytest.raises(RpcError, match="already settled"):
                c.request("decide", request_id=rid, decision="allow_once")
        assert remote_events(url) == []


class TestDenialAndWaits:
    def test_denial_never_reaches_remote(self, sandbox: Sandbox) -> None:
        """A human denial: approval_denied, retry never, and the remote saw nothing."""
        url = setup(sandbox)
        sandbox.start_approver([{"match": {}, "decide": "deny"}])
        run = sandbox.run_agent([CREATE])
        assert (run.results[0]["category"], run.results[0]["retry"]) == ("approval_denied", "never")
        assert remote_events(url) == []

    def test_unroutable_returns_at_once(self, sandbox: Sandbox) -> None:
        """No approver connected: approval_unroutable immediately, human_required."""
        setup(sandbox)
        started = time.monotonic()
        run = sandbox.run_agent([CREATE])
        assert run.results[0]["category"] == "approval_unroutable"
        assert run.results[0]["retry"] == "human_required"
        assert time.monotonic() - started < 30  # the policy deadline is 120 s: no waiting happened
        assert stats(sandbox)["unroutable"] == 1

    def test_owner_not_connected_is_unroutable(self, sandbox: Sandbox) -> None:
        """An owner-bound operation with only another approver connected is unroutable."""
        policy = sandbox.write("owner.yaml", {"risks": {"create": {"mode": "session", "owner": "release-manager"}}})
        setup(sandbox, "--policy", str(policy))
        sandbox.start_approver([{"match": {}, "decide": "allow_once"}], name="someone-else")
        run = sandbox.run_agent([CREATE])
        assert run.results[0]["category"] == "approval_unroutable"
        assert run.results[0]["owner"] == "release-manager"

    def test_pending_then_resume(self, sandbox: Sandbox) -> None:
        """Undecided within wait_s: approval_pending with owner, deadline, token; resume after approval."""
        url = setup(sandbox)
        sandbox.start_approver([{"match": {}, "decide": "ignore"}])
        agent = agent_script(sandbox, (
            "client.open_session('stub', 'run-1')\n"
            "r = client.call('create_issue', {'title': 'x'}, wait_s=0.2)\nout(r)\n"
            "sys.stdin.readline()\n"
            "out(client.resume(r.resume_token))\n"), wait=False)
        first = json.loads(agent.stdout.readline())
        assert first["category"] == "approval_pending"
        assert first["retry"] == "after_approval"
        assert first["owner"] == "any connected approver"
        assert first["deadline"] > time.time()
        assert first["resume_token"]
        assert remote_events(url) == []
        with ApproverClient.for_home(VaultHome(sandbox.home), "human") as c:
            c.request("decide", request_id=first["request_id"], decision="allow_once")
        out, _ = agent.communicate("\n", timeout=60)
        resumed = json.loads(out.splitlines()[0])
        assert resumed["category"] == "success"
        assert resumed["correlation_id"] == first["correlation_id"]
        assert len([e for e in remote_events(url) if e.get("event") == "mutation_committed"]) == 1

    def test_a_prompt_flood_is_capped_per_session(self, sandbox: Sandbox) -> None:
        """wait_s=0 in a loop leaves a prompt each time; past the cap: rate_limited, nobody asked."""
        from vault.gate.engine import MAX_PENDING_PER_SESSION as CAP
        url = setup(sandbox)
        sandbox.start_approver([{"match": {}, "decide": "ignore"}])
        results = agent_script(sandbox, (
            "client.open_session('flood', 'run-1')\n"
            f"for i in range({CAP + 2}):\n"
            "    out(client.call('create_issue', {'title': f'x{i}'}, wait_s=0))\n"))
        assert ["approval_pending"] * CAP + ["rate_limited"] * 2 == [r["category"] for r in results]
        assert results[-1]["retry"] == "after_delay" and results[-1]["retry_after_s"] > 0
        assert "nobody was asked" in results[-1]["message"]
        # the flooder has exited: its prompts were withdrawn, not left waiting for a person
        wait_for(lambda: sandbox.status()["pending"] == 0, what="the flooder's prompts to be withdrawn")
        assert CAP == stats(sandbox)["prompts"]
        assert CAP == stats(sandbox)["decisions"]["withdrawn"]
        # another agent process is still asked
        other = agent_script(sandbox, "client.open_session('other', 'run-2')\n"
                                      "out(client.call('create_issue', {'title': 'y'}, wait_s=0))\n",
                             run_id="run-2")
        assert ["approval_pending"] == [r["category"] for r in other]
        assert remote_events(url) == []

    def test_expired(self, sandbox: Sandbox) -> None:
        """Nobody decides before the deadline: approval_expired, retry never, nothing sent."""
        policy = sandbox.write("short.yaml", {"risks": {"create": {"mode": "session", "deadline_s": 0.5}}})
        url = setup(sandbox, "--policy", str(policy))
        sandbox.start_approver([{"match": {}, "decide": "ignore"}])
        run = sandbox.run_agent([CREATE])
        assert (run.results[0]["category"], run.results[0]["retry"]) == ("approval_expired", "never")
        assert remote_events(url) == []


class TestApproverChannel:
    def test_agent_process_cannot_approve_itself(self, sandbox: Sandbox) -> None:
        """An agent session's process with the correct token is refused on approver.sock."""
        setup(sandbox)
        results = agent_script(sandbox, (
            "from vault.client import ApproverClient\nfrom vault.home import VaultHome\n"
            "from vault.errors import RpcError\n"
            "client.open_session('stub', 'run-1')\n"
            "try:\n"
            "    ApproverClient.for_home(VaultHome.resolve())\n"
            "    print(json.dumps({'refused': False}))\n"
            "except RpcError as e:\n"
            "    print(json.dumps({'refused': True, 'message': e.message}))\n"))
        assert results[0]["refused"] is True
        assert "never approves its own" in results[0]["message"]

    def test_wrong_token_refused_and_unknown_request_is_clear(self, sandbox: Sandbox) -> None:
        """A wrong token is refused; deciding an unknown request says so."""
        from vault.client import RpcClient
        from vault.errors import RpcError
        setup(sandbox)
        with RpcClient(sandbox.home / "approver.sock", timeout=10) as c:
            with pytest.raises(RpcError, match="wrong approver token"):
                c.request("approver.hello", token="nope", name="x")
            with pytest.raises(RpcError, match="approver.hello"):
                c.request("lock")
        with ApproverClient.for_home(VaultHome(sandbox.home), "human") as c:
            with pytest.raises(RpcError, match="unknown request"):
                c.request("decide", request_id="r-missing", decision="deny")


class TestPolicyAndGrantLifetime:
    def test_bad_policy_file_names_file_and_field(self, sandbox: Sandbox) -> None:
        """A policy with a wrong mode is rejected at start with the file, the field and why."""
        policy = sandbox.write("bad.yaml", {"risks": {"create": {"mode": "sometimes"}}})
        out = sandbox.vaultsim("daemon", "--foreground", "--policy", str(policy), timeout=30)
        assert out.returncode == 2
        assert str(policy) in out.stderr
        assert "risks.create.mode" in out.stderr
        assert "Traceback" not in out.stderr

    def test_grant_ends_at_its_ttl(self, sandbox: Sandbox) -> None:
        """A session grant with a TTL stops covering calls once it expires: the next call prompts."""
        policy = sandbox.write("ttl.yaml", {"risks": {"create": {"mode": "session", "ttl_s": 0.5}}})
        setup(sandbox, "--policy", str(policy))
        sandbox.start_approver([{"match": {}, "decide": "allow_session"}])
        proc = agent_script(sandbox, (
            "client.open_session('stub', 'run-1')\n"
            "out(client.call('create_issue', {'title': 'a'}))\n"
            "sys.stdin.readline()\n"
            "out(client.call('create_issue', {'title': 'b'}))\n"), wait=False)
        assert json.loads(proc.stdout.readline())["category"] == "success"
        with ApproverClient.for_home(VaultHome(sandbox.home), "test") as c:
            wait_for(lambda: c.request("sessions")["sessions"]
                     and not c.request("sessions")["sessions"][0]["grants"], what="the grant to expire")
        out, _ = proc.communicate("\n", timeout=60)
        assert json.loads(out.splitlines()[0])["category"] == "success"
        assert stats(sandbox)["prompts"] == 2


class TestScriptedApprover:
    def test_unmatched_is_denied_logged_and_approver_exits_with_daemon(self, sandbox: Sandbox) -> None:
        """No rule matches: deny; the answer is logged; when the daemon stops the approver exits 0."""
        setup(sandbox)
        approver = sandbox.start_approver([{"match": {"operation": "read_*"}, "decide": "allow_once"}])
        run = sandbox.run_agent([CREATE])
        assert run.results[0]["category"] == "approval_denied"
        logged = [json.loads(line) for line in approver.log_path.read_text().splitlines()]
        assert [(e["operation"], e["decision"], e["rule"], e["accepted"]) for e in logged] == [
            ("create_issue", "deny", None, True)]
        assert sandbox.vaultsim("stop").returncode == 0
        assert approver.wait(timeout=30) == 0


    def test_a_log_it_cannot_write_does_not_stop_its_decisions(self, sandbox: Sandbox) -> None:
        """--log on a full disk: the approver keeps deciding and says once that the log stopped."""
        setup(sandbox)
        sandbox.start_approver([{"decide": "allow_once"}], log=Path("/dev/full"))
        assert ["success", "success"] == [r["category"] for r in sandbox.run_agent([CREATE, CREATE]).results]
        err = (sandbox.root / "approver.stderr").read_text()
        assert 1 == err.count("cannot write the decision log") and "Traceback" not in err

    def test_a_log_it_cannot_open_is_bad_input(self, sandbox: Sandbox) -> None:
        script = sandbox.write("s.yaml", {"name": "ci", "rules": [{"decide": "deny"}]})
        proc = sandbox.vaultsim("approve", "--script", str(script), "--log", str(sandbox.root / "no" / "x.log"))
        assert 2 == proc.returncode
        assert "--log: cannot open" in proc.stderr and "Traceback" not in proc.stderr

    def test_lock_answer_locks_the_vault(self, sandbox: Sandbox) -> None:
        """A `lock` rule refuses the pending request by locking: approval_denied, then vault_locked."""
        url = setup(sandbox)
        sandbox.start_approver([{"decide": "lock"}])
        run = sandbox.run_agent([CREATE])
        assert run.results[0]["category"] == "approval_denied"
        assert sandbox.status()["locked"] is True
        assert sandbox.run_agent([CREATE]).results[0]["category"] == "vault_locked"
        assert remote_events(url) == []


class TestApproverDescendant:
    def test_approver_that_becomes_an_agent_cannot_decide_its_own_request(self, sandbox: Sandbox) -> None:
        """Hello first, then open an agent session: deciding that session's request is refused."""
        setup(sandbox)
        results = agent_script(sandbox, (
            "import asyncio\n"
            "from vault.client import connect_approver\nfrom vault.home import VaultHome\n"
            "from vault.errors import RpcError\n"
            "async def main():\n"
            "    approver, _ = await connect_approver(VaultHome.resolve(), 'sneaky')\n"
            "    client.open_session('stub', 'run-1')\n"
            "    call = asyncio.ensure_future(asyncio.to_thread(client.call, 'create_issue', {'title': 'x'}, wait_s=1))\n"
            "    while not (await approver.request('status'))['pending']:\n"
            "        await asyncio.sleep(0.02)\n"
            "    rid = (await approver.request('subscribe'))['pending'][0]['request_id']\n"
            "    try:\n"
            "        await approver.request('decide', request_id=rid, decision='allow_once')\n"
            "        print(json.dumps({'refused': False}))\n"
            "    except RpcError as e:\n"
            "        print(json.dumps({'refused': True, 'message': e.message}))\n"
            "    out(await call)\n"
            "asyncio.run(main())\n"))
        assert results[0]["refused"] is True
        assert "never approves its own" in results[0]["message"]
        assert results[1]["category"] == "approval_pending"

    def test_child_of_agent_cannot_approve(self, sandbox: Sandbox) -> None:
        """A process spawned by an agent session's process is refused on approver.sock, token or not."""
        setup(sandbox)
        results = agent_script(sandbox, (
            "import subprocess\n"
            "client.open_session('stub', 'run-1')\n"
            "child = ('import json\\nfrom vault.client import ApproverClient\\nfrom vault.home import VaultHome\\n'\n"
            "  'from vault.errors import RpcError\\n'\n"
            "  'try:\\n    ApproverClient.for_home(VaultHome.resolve()); print(json.dumps({\"refused\": False}))\\n'\n"
            "  'except RpcError as e:\\n    print(json.dumps({\"refused\": True, \"message\": e.message}))\\n')\n"
            "res = subprocess.run([sys.executable, '-c', child], capture_output=True, text=True)\n"
            "print(res.stdout.strip())\n"))
        assert results[0]["refused"] is True
        assert "descendants" in results[0]["message"]
