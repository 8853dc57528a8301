"""Protected diagnostics: encrypted, private, redacted, and loaded only by a valid id."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from vault.daemon.diagnostics import Diagnostics, redact
from vault.errors import BadInput, VaultError
from vault.store.secret import Secret

ROOT = Path(__file__).resolve().parent.parent
CANARY = "CANARY-diag-" + os.urandom(6).hex()


@pytest.fixture
def diag(tmp_path: Path) -> Diagnostics:
    return Diagnostics(tmp_path / "diagnostics", os.urandom(32), secrets=[CANARY])


class TestRoundTrip:
    def test_record_and_load(self, diag: Diagnostics) -> None:
        """What is recorded comes back, under a d- id."""
        did = diag.record({"status": 500, "body": "boom"})
        assert did.startswith("d-")
        assert {"status": 500, "body": "boom"} == diag.load(did)

    def test_file_is_private_and_encrypted(self, diag: Diagnostics) -> None:
        """The file is 0600 in a 0700 directory and holds no plaintext."""
        did = diag.record({"body": "plaintext-marker"})
        path = diag.directory / f"{did}.diag"
        assert 0o600 == stat.S_IMODE(path.stat().st_mode)
        assert 0o700 == stat.S_IMODE(diag.directory.stat().st_mode)
        assert b"plaintext-marker" not in path.read_bytes()


class TestRedaction:
    def test_headers_and_known_secrets(self, diag: Diagnostics) -> None:
        """Authorization/Cookie headers (dict or pairs) and known secret values never reach disk."""
        did = diag.record({
            "request_headers": {"Authorization": f"Bearer {CANARY}", "Cookie": "a=b"},
            "headers": [["Set-Cookie", "s=1"], ["X-Echo", f"token was {CANARY}"]],
            "body": f'{{"echo": "{CANARY}"}}',
            f"key-{CANARY}": 1,
        })
        raw = (diag.directory / f"{did}.diag").read_bytes()
        shown = json.dumps(diag.load(did))
        assert CANARY not in shown and CANARY.encode() not in raw
        assert "[redacted]" == diag.load(did)["request_headers"]["Authorization"]
        assert ["Set-Cookie", "[redacted]"] == diag.load(did)["headers"][0]

    def test_per_record_secrets_and_secret_objects(self, diag: Diagnostics) -> None:
        """Secrets passed to record() (also as Secret) are scrubbed, as are unknown bearer tokens."""
        did = diag.record({"a": "x-other-secret-x", "b": Secret("s3cr3t"), "c": "Bearer abc.def"},
                          secrets=[Secret("other-secret")])
        assert {"a": "x-[redacted]-x", "b": "[redacted]", "c": "Bearer [redacted]"} == diag.load(did)

    def test_redact_is_pure(self) -> None:
        """redact() returns a copy and leaves the input alone."""
        data = {"Authorization": "Bearer x"}
        assert {"Authorization": "[redacted]"} == redact(data)
        assert {"Authorization": "Bearer x"} == data


class TestLoadRefusals:
    @pytest.mark.parametrize("bad", ["../../etc/passwd", "d-../x", "d-xyz", "", "d-" + "0" * 26,
                                     "D-" + "0" * 27, "d-" + "0" * 27 + "/x"],
                             ids=["traversal", "dotdot", "not-hex", "empty", "short", "case", "slash"])
    def test_bad_ids_are_bad_input(self, diag: Diagnostics, bad: str) -> None:
        """Anything but a well-formed id is refused before touching the filesystem."""
        with pytest.raises(BadInput):
            diag.load(bad)

    def test_unknown_id_is_bad_input(self, diag: Diagnostics) -> None:
        """A well-formed id with no file is BadInput."""
        with pytest.raises(BadInput):
            diag.load("d-" + "0" * 27)

    def test_wrong_key_or_swapped_file_fails_closed(self, diag: Diagnostics, tmp_path: Path) -> None:
        """Another key, or a file renamed to another id, does not decrypt."""
        a, b = diag.record({"x": 1}), diag.record({"x": 2})
        other = Diagnostics(diag.directory, os.urandom(32))
        with pytest.raises(VaultError) as err:
            other.load(a)
        assert not isinstance(err.value, BadInput)
        os.replace(diag.directory / f"{b}.diag", diag.directory / f"{a}.diag")
        with pytest.raises(VaultError):
            diag.load(a)



class TestRetention:
    """An agent failing in a loop must not fill the disk: the newest `keep` are kept."""

    def test_oldest_removed_past_the_cap(self, tmp_path: Path) -> None:
        diag = Diagnostics(tmp_path / "d", os.urandom(32), keep=3)
        ids = [diag.record({"n": i}) for i in range(5)]
        on_disk = sorted(p.name[:-5] for p in diag.directory.glob("*.diag"))
        assert sorted(ids[2:]) == on_disk
        assert [{"n": 2}, {"n": 3}, {"n": 4}] == [diag.load(i) for i in ids[2:]]
        with pytest.raises(BadInput) as err:
            diag.load(ids[0])
        assert "keeps the newest 3" in err.value.message

    def test_a_restarted_store_counts_what_is_already_there(self, tmp_path: Path) -> None:
        key = os.urandom(32)
        first = Diagnostics(tmp_path / "d", key, keep=10)
        old = [first.record({"n": i}) for i in range(4)]
        again = Diagnostics(tmp_path / "d", key, keep=3)  # e.g. the daemon restarted
        new = again.record({"n": 4})
        left = sorted(p.name[:-5] for p in again.directory.glob("*.diag"))
        assert sorted([*old[2:], new]) == left
        # files that are not diagnostics are never touched
        (again.directory / "notes.txt").write_text("operator's")
        for i in range(5):
            again.record({"n": 5 + i})
        assert (again.directory / "notes.txt").exists()
        assert 3 == len(list(again.directory.glob("*.diag")))

class TestCli:
    def test_diag_show(self, tmp_path: Path) -> None:
        """`vaultsim diag show ID` decrypts with the home's derived key and prints redacted JSON."""
        pytest.importorskip("vault.store.keystore")
        from vault.home import VaultHome
        from vault.store.keyring_backend import FileKeyring
        from vault.store.keystore import KeyStore

        env = {**os.environ, "VAULTSIM_HOME": str(tmp_path / "home"),
               "VAULTSIM_KEYRING_DIR": str(tmp_path / "kr"),
               "PYTHON_KEYRING_BACKEND": "vault.store.keyring_backend.FileKeyring"}
        home = VaultHome.resolve(tmp_path / "home").ensure()
        key = KeyStore(home, backend=FileKeyring(tmp_path / "kr")).derive("diagnostics")
        did = Diagnostics(home.diagnostics_dir, key).record({"status": 403, "note": f"Bearer {CANARY}"})
        proc = subprocess.run([sys.executable, "-m", "vault.cli.main", "diag", "show", did], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert 0 == proc.returncode, proc.stderr
        assert 403 == json.loads(proc.stdout)["status"]
        assert CANARY not in proc.stdout + proc.stderr
        bad = subprocess.run([sys.executable, "-m", "vault.cli.main", "diag", "show", "../x"], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert 2 == bad.returncode
