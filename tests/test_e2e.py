"""End to end with real processes: a credential never enters the agent process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import PY, ROOT, Sandbox, canary, remote_events, remote_ledger, wait_for
from vault.client import ApproverClient
from vault.home import VaultHome
from vault.pytest_plugin import Vaultsim


def files_containing(root: Path, needle: bytes) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_socket():
            try:
                if needle in path.read_bytes():
                    hits.append(str(path))
            except OSError:
                pass
    return hits


class TestCredentialNeverInAgent:
    def test_agent_creates_issue_without_holding_the_credential(self, sandbox: Sandbox) -> None:
        """secret set a canary; a fresh agent_stub creates an issue; the canary is nowhere the agent sees."""
        secret = canary()
        # the remote accepts exactly this token and nothing else
        _, url = sandbox.start_remote({"tracker_token": secret})
        sandbox.set_secret("tracker_token", secret)
        sandbox.start_daemon("--remote", url)
        sandbox.start_approver([{"match": {"operation": "create_issue"}, "decide": "ignore"}])

        plan = sandbox.write("plan.yaml", {"agent": "stub", "steps": [
            {"call": "create_issue", "params": {"title": "canary check"}}]})
        env = {**sandbox.env, "VAULTSIM_SOCKET": str(sandbox.agent_sock), "VAULTSIM_RUN_ID": "e2e"}
        agent = subprocess.Popen([PY, "-m", "agent_stub", "--plan", str(plan)], env=env, cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        home = VaultHome(sandbox.home)
        with ApproverClient.for_home(home, "human") as approver:
            pending = wait_for(lambda: approver.request("subscribe")["pending"], what="the agent's prompt")
            # while the agent process is alive and waiting, inspect its environment and memory map
            environ = Path(f"/proc/{agent.pid}/environ").read_bytes()
            assert secret.encode() not in environ
            assert pending[0]["agent"] == "stub" and pending[0]["pid"] == agent.pid
            approver.request("decide", request_id=pending[0]["request_id"], decision="allow_session")
        out, err = agent.communicate(timeout=60)
        assert agent.returncode == 0, err
        result = json.loads(out.splitlines()[0])
        assert result["category"] == "success"
        assert result["data"]["id"]
        # the remote accepted it, so it received exactly the canary as its bearer token
        ledger = remote_ledger(url)
        effects = sum(e["effects"] for e in ledger["operations"]) if "operations" in ledger else None
        assert effects == 1, ledger
        # ... and the canary appears nowhere the agent or a log could see
        assert secret not in out and secret not in err
        assert secret not in json.dumps(remote_events(url))
        assert files_containing(sandbox.home, secret.encode()) == []
        assert files_containing(sandbox.root / "kr", secret.encode()) == []
        assert secret not in (sandbox.root / "daemon.stderr").read_text()

    @pytest.mark.vaultsim(credentials=[])
    def test_missing_credential_is_a_clear_refusal(self, vaultsim: Vaultsim) -> None:
        """No credential set for the operation: authentication_failed naming it; the remote saw nothing."""
        client = vaultsim.client()
        result = client.call("read_issue", {"issue_id": "ISS-1"})
        assert (result.category, result.retry) == ("authentication_failed", "never")
        assert "tracker_token" in result.message and "vaultsim secret set" in result.message
        assert vaultsim.remote_events == []
        # the daemon serves on
        assert "authentication_failed" == client.call("read_issue", {"issue_id": "ISS-2"}).category
