"""Keyring backends the vault's data key can live in: one contract, two backends.

keyring's own `BackendBasicTests` (plus what vaultsim relies on) runs against
the embedded file keyring and a real Secret Service (gnome-keyring in a private
D-Bus session, see fixtures_keyring).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import platformdirs
import pytest
from fixtures_keyring import (  # noqa: F401 - pytest fixtures
    PYTHON,
    ROOT,
    SecretServiceSession,
    isolated_env,
    secret_service,
    secret_service_env,
    secret_service_session,
    skip_without_gnome_keyring,
)
from keyring.backends import SecretService, fail
from keyring.errors import KeyringError
from keyring.testing.backend import BackendBasicTests
from keyring.testing.util import random_string

from vault.store.keyring_backend import FileKeyring, default_dir

pytestmark = pytest.mark.usefixtures("isolated_env")


class BackendContract(BackendBasicTests):
    """keyring's basic backend tests, plus what the vault's KeyStore relies on."""

    @pytest.fixture(autouse=True)
    def _init_properties(self, request, backend_setup):
        # replaces BackendBasicTests' fixture so the backend's environment is
        # up before the keyring is built and still up for its cleanup
        self.keyring = self.init_keyring()
        self.credentials_created = set()
        request.addfinalizer(self.cleanup)

    def test_persists_across_instances(self):
        """A value set through one backend instance is read by a fresh one."""
        service, username = random_string(12), random_string(12)
        self.set_password(service, username, "persisted")
        assert "persisted" == self.init_keyring().get_password(service, username)

    def test_overwrite(self):
        """Setting again replaces the value (one entry, not two)."""
        service, username = random_string(12), random_string(12)
        self.set_password(service, username, "one")
        self.set_password(service, username, "two")
        assert "two" == self.keyring.get_password(service, username)
        self.keyring.delete_password(service, username)
        self.credentials_created.discard((service, username))
        assert self.keyring.get_password(service, username) is None


class TestFileKeyring(BackendContract):
    @pytest.fixture
    def backend_setup(self, tmp_path):
        self.directory = tmp_path / "kr"

    def init_keyring(self):
        return FileKeyring(self.directory)


@pytest.mark.secret_service
class TestSecretServiceKeyring(BackendContract):
    @pytest.fixture
    def backend_setup(self, secret_service_env):
        pass

    def init_keyring(self):
        return SecretService.Keyring()

    def test_ranks_above_file_keyring(self):
        """A working Secret Service outranks the embedded keyring."""
        assert SecretService.Keyring.priority > FileKeyring.priority


class TestFileKeyringStorage:
    """The embedded keyring's file: where, which modes, how it fails, who wins."""

    def test_dir_from_env(self, tmp_path, monkeypatch):
        """$VAULTSIM_KEYRING_DIR picks the directory, read at each call."""
        monkeypatch.setenv("VAULTSIM_KEYRING_DIR", str(tmp_path / "a"))
        ring = FileKeyring()
        ring.set_password("s", "u", "p")
        assert (tmp_path / "a" / "keyring.json").exists()
        monkeypatch.setenv("VAULTSIM_KEYRING_DIR", str(tmp_path / "b"))
        assert ring.get_password("s", "u") is None

    def test_default_dir_is_platformdirs(self, monkeypatch):
        """Without the env var the file lives in the user data dir, outside any home."""
        monkeypatch.delenv("VAULTSIM_KEYRING_DIR")
        assert Path(platformdirs.user_data_dir("vaultsim-keyring")) == default_dir()

    def test_modes(self, tmp_path):
        """The directory is 0700 and the file 0600, whatever the umask."""
        old = os.umask(0)
        try:
            ring = FileKeyring(tmp_path / "kr")
            ring.set_password("s", "u", "p")
        finally:
            os.umask(old)
        assert 0o700 == stat.S_IMODE((tmp_path / "kr").stat().st_mode)
        assert 0o600 == stat.S_IMODE((tmp_path / "kr" / "keyring.json").stat().st_mode)

    def test_existing_open_dir_is_refused_not_changed(self, tmp_path):
        """A pre-existing 0755 directory is refused with the fix, and left as it was:
        the vault never chmods a directory it did not create."""
        (tmp_path / "kr").mkdir()
        os.chmod(tmp_path / "kr", 0o755)
        for use in (lambda r: r.set_password("s", "u", "p"), lambda r: r.get_password("s", "u")):
            with pytest.raises(KeyringError, match=r"mode 0755.*chmod 700"):
                use(FileKeyring(tmp_path / "kr"))
        assert 0o755 == stat.S_IMODE((tmp_path / "kr").stat().st_mode)
        assert [] == list((tmp_path / "kr").iterdir())

    def test_symlinked_dir_is_refused(self, tmp_path):
        """A keyring directory that is a symlink could be pointed anywhere: refused."""
        (tmp_path / "real").mkdir(mode=0o700)
        (tmp_path / "kr").symlink_to(tmp_path / "real")
        with pytest.raises(KeyringError, match="is a symlink"):
            FileKeyring(tmp_path / "kr").set_password("s", "u", "p")
        assert [] == list((tmp_path / "real").iterdir())

    def test_no_temp_files_left(self, tmp_path):
        """Atomic writes leave only the data file and the lock file."""
        ring = FileKeyring(tmp_path / "kr")
        for i in range(5):
            ring.set_password("s", f"u{i}", "p")
        ring.delete_password("s", "u0")
        assert ["keyring.json", "keyring.lock"] == sorted(p.name for p in (tmp_path / "kr").iterdir())

    @pytest.mark.parametrize(
        "content",
        [b"CANARY-corrupt{not json", b'{"format": "other", "entries": {}}',
         b'{"format": "vaultsim-keyring/1", "entries": {"s": {"u": 5}}}', b"[]"],
        ids=["garbage", "wrong-format", "wrong-type", "not-an-object"],
    )
    def test_corrupt_file(self, tmp_path, content):
        """A damaged file is a KeyringError naming the file, never quoting it."""
        (tmp_path / "kr").mkdir(mode=0o700)
        (tmp_path / "kr" / "keyring.json").write_bytes(content)
        with pytest.raises(KeyringError) as info:
            FileKeyring(tmp_path / "kr").get_password("s", "u")
        assert "keyring.json" in str(info.value)
        assert "CANARY" not in str(info.value)

    def test_concurrent_writers(self, tmp_path):
        """Parallel processes each adding entries lose none of them (flock)."""
        code = (
            "import sys; from vault.store.keyring_backend import FileKeyring\n"
            "r = FileKeyring(sys.argv[1])\n"
            "for i in range(10): r.set_password('svc', f'{sys.argv[2]}-{i}', 'x')\n"
        )
        procs = [
            subprocess.Popen([PYTHON, "-c", code, str(tmp_path / "kr"), f"w{n}"], cwd=ROOT)
            for n in range(6)
        ]
        assert [0] * 6 == [p.wait(timeout=60) for p in procs]
        doc = json.loads((tmp_path / "kr" / "keyring.json").read_text())
        assert {f"w{n}-{i}" for n in range(6) for i in range(10)} == set(doc["entries"]["svc"])


class TestDiscovery:
    """keyring finds the embedded backend through the entry point and ranks it."""

    def test_ranks_between_fail_and_native(self):
        """Above keyring's fail backend, below every native store, and 'recommended'."""
        assert fail.Keyring.priority < FileKeyring.priority < 4.8
        assert FileKeyring.viable

    def test_selected_on_headless_machine(self, isolated_env):
        """With no Secret Service, keyring alone picks the embedded backend."""
        env = {k: v for k, v in isolated_env.items() if k != "PYTHON_KEYRING_BACKEND"}
        out = subprocess.run(
            [PYTHON, "-c", "import keyring; print(type(keyring.get_keyring()).__qualname__)"],
            env=env, capture_output=True, text=True, timeout=60, check=True,
        )
        assert "FileKeyring" == out.stdout.strip(), (
            "entry point not found: is vaultsim installed (pip install -e .)?"
        )

    @pytest.mark.secret_service
    def test_secret_service_preferred_when_running(self, isolated_env, secret_service):
        """With a Secret Service on the bus, it is the store the data key goes to."""
        env = {k: v for k, v in isolated_env.items() if k != "PYTHON_KEYRING_BACKEND"}
        env["DBUS_SESSION_BUS_ADDRESS"] = secret_service.address
        code = (
            "from vault.home import VaultHome; from vault.store.keystore import KeyStore\n"
            "print(KeyStore(VaultHome.resolve()).backend_name())"
        )
        out = subprocess.run(
            [PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
        )
        assert "SecretService Keyring" == out.stdout.strip()


@pytest.mark.secret_service
@skip_without_gnome_keyring
class TestSecretServiceFixture:
    def test_cleans_up_its_processes(self):
        """A session's dbus-daemon and gnome-keyring are gone (and reaped) after it."""
        with secret_service_session() as session:
            procs = list(session.procs)
            assert 2 == len(procs) and all(p.poll() is None for p in procs)
        assert all(p.returncode is not None for p in procs)
        assert not session.root.exists()

    def test_does_not_touch_user_dirs(self, secret_service: SecretServiceSession):
        """The keyring files are under the session's throwaway XDG_DATA_HOME."""
        assert secret_service.keyring_files_dir.is_relative_to(secret_service.root)
        assert (secret_service.keyring_files_dir / "login.keyring").exists()
