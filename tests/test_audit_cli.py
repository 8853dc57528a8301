"""`vaultsim audit verify|show`: exit codes, text and JSON output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from vault.audit import load_or_create_signing_key
from vault.audit.adapter import open_audit
from vault.cli.main import main
from vault.home import VaultHome

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path: Path):
    """A vault home with a daemon-style audit log (adapter + signing key in the home)."""
    vh = VaultHome(tmp_path / "home").ensure()
    key = os.urandom(32)
    w = open_audit(vh, key)
    for ev in ({"type": "session_opened", "session_id": "s-1", "agent": "stub", "pid": 7, "run_id": "r"},
               {"type": "intent", "correlation_id": "c-1", "operation": "create_issue", "target": "api"},
               {"type": "remote_result", "correlation_id": "c-1", "category": "success", "remote_touched": True,
         "diagnostic_id": "d"}):
        w.append_sync(ev)
    w.close()
    return vh, key


class TestVerifyCommand:
    def test_intact_exit_0(self, home, capsys) -> None:
        """verify on the home's log prints intact and exits 0."""
        vh, _ = home
        assert 0 == main(["audit", "verify", "--home", str(vh.root)])
        assert capsys.readouterr().out.startswith("intact: 3 records")

    def test_json(self, home, capsys) -> None:
        """--json prints the VerifyReport."""
        vh, _ = home
        assert 0 == main(["audit", "verify", str(vh.audit_log), "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert ("intact", 3, 2) == (doc["status"], doc["records"], doc["last_signed_seq"])

    def test_tampered_exit_1(self, home, capsys) -> None:
        """A damaged log exits 1 and names the first bad seq."""
        vh, _ = home
        data = bytearray(vh.audit_log.read_bytes())
        data[20] ^= 1
        vh.audit_log.write_bytes(bytes(data))
        assert 1 == main(["audit", "verify", str(vh.audit_log)])
        assert capsys.readouterr().out.startswith("tampered at seq 0:")

    def test_missing_file_exit_2(self, tmp_path: Path, capsys) -> None:
        """A missing log is bad input: exit 2 with a message on stderr."""
        assert 2 == main(["audit", "verify", str(tmp_path / "nope.log")])
        assert "no audit log" in capsys.readouterr().err

    def test_not_a_log_exit_2(self, tmp_path: Path, capsys) -> None:
        """A file that is not an audit log: exit 2."""
        p = tmp_path / "notes.txt"
        p.write_text("just text\n")
        assert 2 == main(["audit", "verify", str(p)])

    def test_unverifiable_exit_1(self, home, capsys) -> None:
        """No public key: unverifiable, exit 1."""
        vh, _ = home
        (vh.root / "audit.pub").unlink()
        assert 1 == main(["audit", "verify", "--home", str(vh.root)])
        assert capsys.readouterr().out.startswith("unverifiable")

    def test_real_process(self, home) -> None:
        """The command works as a real process (python -m vault.cli.main)."""
        vh, _ = home
        proc = subprocess.run([sys.executable, "-m", "vault.cli.main", "audit", "verify", str(vh.audit_log)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert (0, "intact") == (proc.returncode, proc.stdout.split(":")[0]), proc.stderr


class TestShowCommand:
    @pytest.fixture
    def keystore(self, home, monkeypatch):
        """A stand-in vault.store.keystore that hands out the home's audit key."""
        vh, key = home
        fake = types.ModuleType("vault.store.keystore")

        class KeyStore:
            def __init__(self, h: VaultHome) -> None:
                assert h.root == vh.root

            def derive(self, purpose: str) -> bytes:
                assert "audit" == purpose
                return key

        fake.KeyStore = KeyStore  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "vault.store.keystore", fake)
        return vh

    def test_text(self, keystore, capsys) -> None:
        """show prints sessions and activity."""
        assert 0 == main(["audit", "show", "--home", str(keystore.root)])
        out = capsys.readouterr().out
        assert "sessions (1)" in out and "agent=stub pid=7" in out and "activity (3 events)" in out

    def test_correlation_json(self, keystore, capsys) -> None:
        """--correlation --json lists exactly that id's events."""
        assert 0 == main(["audit", "show", "--home", str(keystore.root), "--correlation", "c-1", "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert ["intent", "remote_result"] == [ev["type"] for ev in doc["events"]]

    def test_json(self, keystore, capsys) -> None:
        """--json has sessions and events."""
        assert 0 == main(["audit", "show", "--home", str(keystore.root), "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert (1, 3) == (len(doc["sessions"]), len(doc["events"]))


def test_adapter_reuses_the_signing_key(home) -> None:
    """open_audit twice on one home continues one chain under one key."""
    vh, key = home
    sk = load_or_create_signing_key(vh.root, key)
    w = open_audit(vh, key)
    assert 3 == w.append_sync({"type": "unlock", "by": "alice"})
    w.close()
    from vault.audit import verify
    assert "intact" == verify(vh.audit_log).status
    assert sk.public_key().public_bytes_raw() == load_or_create_signing_key(vh.root, key).public_key().public_bytes_raw()


class TestWithTheDaemon:
    def test_daemon_log_verifies_and_shows(self, sandbox) -> None:
        """A real daemon's log: consistent while it runs (its newest records maybe not signed yet:
        unanchored, exit 1), intact and fully anchored after stop, shown."""
        from helpers import stop_process
        daemon = sandbox.start_daemon()
        run = sandbox.run_agent([])
        assert 0 == run.proc.returncode, run.proc.stderr
        live = sandbox.vaultsim("audit", "verify", "--json")
        status = json.loads(live.stdout)["status"]
        assert (live.returncode, status) in {(0, "intact"), (1, "unanchored")}, live.stdout + live.stderr
        stop_process(daemon)
        done = sandbox.vaultsim("audit", "verify", "--json")
        report = json.loads(done.stdout)
        assert (0, "intact", 0) == (done.returncode, report["status"], report["unanchored"])
        shown = sandbox.vaultsim("audit", "show", "--json")
        assert 0 == shown.returncode, shown.stderr
        types_ = [ev["type"] for ev in json.loads(shown.stdout)["events"]]
        assert ["daemon_started", "session_opened", "session_closed"] == types_[:3]
