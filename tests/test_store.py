"""Credential store, data key and `vaultsim secret`, through both keyring backends.

Every test that stores a value plants a canary and checks it appears nowhere
it must not: files on disk, exceptions, reprs, CLI output.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import pickle
import pty
import secrets
import select
import stat
import subprocess
import termios
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fixtures_keyring import (  # noqa: F401 - pytest fixtures
    PYTHON,
    ROOT,
    isolated_env,
    secret_service,
    secret_service_env,
)
from keyring.backend import KeyringBackend
from keyring.backends import SecretService, fail, null
from keyring.errors import KeyringError

from vault.errors import BadInput, CredentialError, KeyUnavailable, MissingCredential
from vault.home import VaultHome
from vault.store.keyring_backend import FileKeyring
from vault.store.keystore import SERVICE, KeyStore
from vault.store.secret import MASK, Secret
from vault.store.credentials import CredentialInfo, CredentialStore

pytestmark = pytest.mark.usefixtures("isolated_env")


def canary() -> str:
    return f"CANARY-{secrets.token_hex(8)}"


@dataclass
class Backend:
    """One keyring backend under test and where it keeps its files."""

    keyring: KeyringBackend
    dirs: list[Path]  # where key material may legitimately live on disk
    child_env: dict[str, str]  # env for a `vaultsim` subprocess using this backend
    tmp: Path
    keystores: list[KeyStore] = field(default_factory=list)

    def vault(self, name: str = "home", clock=time.time) -> tuple[VaultHome, KeyStore, CredentialStore]:
        home = VaultHome.resolve(self.tmp / name)
        keystore = KeyStore(home, self.keyring)
        self.keystores.append(keystore)  # destroyed at teardown: the SS keyring is shared
        return home, keystore, CredentialStore(home, keystore, clock=clock)

    def cli_env(self, home: VaultHome) -> dict[str, str]:
        # the subprocess's key must be cleaned up too
        self.keystores.append(KeyStore(home, self.keyring))
        return {**self.child_env, "VAULTSIM_HOME": str(home.root)}

    def assert_not_on_disk(self, home: VaultHome, needle: str) -> None:
        files = [p for d in [home.root, *self.dirs] for p in d.rglob("*") if p.is_file()]
        assert files, "nothing to search"
        for path in files:
            assert needle.encode() not in path.read_bytes(), f"{needle} found in {path}"


@pytest.fixture(params=["file", pytest.param("secret_service", marks=pytest.mark.secret_service)])
def backend(request, isolated_env, tmp_path):
    if request.param == "file":
        kr_dir = Path(isolated_env["VAULTSIM_KEYRING_DIR"])
        b = Backend(FileKeyring(), [kr_dir], dict(isolated_env), tmp_path)
    else:
        session = request.getfixturevalue("secret_service_env")
        env = {
            **isolated_env,
            "DBUS_SESSION_BUS_ADDRESS": session.address,
            "PYTHON_KEYRING_BACKEND": "keyring.backends.SecretService.Keyring",
        }
        b = Backend(SecretService.Keyring(), [session.root], env, tmp_path)
    yield b
    for keystore in b.keystores:
        keystore.destroy()


def run_cli(env: dict[str, str], *args: str, stdin: str | bytes = b"") -> subprocess.CompletedProcess[str]:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = subprocess.run(
        [PYTHON, "-m", "vault.cli.main", *args], input=data, env=env, cwd=ROOT,
        capture_output=True, timeout=60,
    )
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode()
    )


class TestSecretMasking:
    """A Secret shows its value only through reveal()."""

    @pytest.mark.parametrize(
        "render",
        [repr, str, lambda s: f"{s}", lambda s: f"{s!r}", lambda s: f"{s:>40}",
         lambda s: "%s" % s, lambda s: json.dumps({"v": s}, default=str), lambda s: str([s])],
        ids=["repr", "str", "fstring", "fstring-repr", "format-spec", "percent", "json", "in-list"],
    )
    def test_masked(self, render):
        """Every ordinary rendering shows the mask, never the value."""
        value = canary()
        out = render(Secret(value))
        assert value not in out and MASK in out

    def test_reveal(self):
        """reveal() gives the value back, bytes decoded."""
        assert "v" == Secret(b"v").reveal()

    def test_not_picklable(self):
        """A Secret cannot be pickled (and so cannot leave through multiprocessing)."""
        with pytest.raises(TypeError):
            pickle.dumps(Secret("v"))


class TestKeyStore:
    """The per-home data key kept in keyring, and the keys derived from it."""

    def test_key_created_and_stored(self, backend):
        """The first use creates 32 random bytes, stored base64 under a per-home name."""
        home, keystore, _ = backend.vault()
        key = keystore.data_key()
        assert 32 == len(key)
        username = "data-key:" + hashlib.sha256(str(home.root).encode()).hexdigest()[:16]
        assert key == base64.b64decode(backend.keyring.get_password(SERVICE, username))

    def test_key_not_in_home(self, backend):
        """The data key lives in keyring, in no file of the vault home."""
        home, keystore, store = backend.vault()
        store.set("A", "v")
        encoded = base64.b64encode(keystore.data_key())
        files = [p for p in home.root.rglob("*") if p.is_file()]
        assert files and not [p for p in files if encoded in p.read_bytes()]

    def test_persists_across_instances(self, backend):
        """A new KeyStore on the same home gets the same key."""
        home, keystore, _ = backend.vault()
        assert keystore.data_key() == KeyStore(home, backend.keyring).data_key()

    def test_homes_have_different_keys(self, backend):
        """Two homes coexist in one keyring with different keys."""
        _, a, _ = backend.vault("a")
        _, b, _ = backend.vault("b")
        assert a.data_key() != b.data_key()

    def test_derive(self, backend):
        """derive() is deterministic per purpose, 32 bytes, different across purposes."""
        home, keystore, _ = backend.vault()
        keys = {p: keystore.derive(p) for p in ("credentials", "audit", "diagnostics")}
        assert all(32 == len(k) for k in keys.values())
        assert 3 == len(set(keys.values())) and keystore.data_key() not in keys.values()
        assert keys["audit"] == KeyStore(home, backend.keyring).derive("audit")

    def test_destroy(self, backend):
        """destroy() removes the key; the home then has none; twice is fine."""
        home, keystore, _ = backend.vault()
        old = keystore.data_key()
        keystore.destroy()
        keystore.destroy()
        with pytest.raises(KeyUnavailable):
            KeyStore(home, backend.keyring).data_key(create=False)
        assert old != keystore.data_key()

    def test_backend_name(self, backend):
        """backend_name() names the store that holds the key."""
        _, keystore, _ = backend.vault()
        expected = {FileKeyring: "vaultsim file keyring (embedded)",
                    SecretService.Keyring: "SecretService Keyring"}[type(backend.keyring)]
        assert expected == keystore.backend_name()

    def test_repr_hides_key(self, backend):
        """The key is never in the KeyStore's repr."""
        _, keystore, _ = backend.vault()
        key = keystore.data_key()
        for text in (repr(keystore), str(keystore)):
            assert base64.b64encode(key).decode() not in text and key.hex() not in text

    def test_parallel_first_use_agrees(self, backend):
        """Processes racing to create a home's key all end up with one key."""
        home, _, _ = backend.vault()
        code = (
            "from vault.home import VaultHome; from vault.store.keystore import KeyStore\n"
            "print(KeyStore(VaultHome.resolve()).data_key().hex())"
        )
        env = backend.cli_env(home)
        procs = [subprocess.Popen([PYTHON, "-c", code], env=env, cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(6)]
        results = [p.communicate(timeout=60) for p in procs]
        errors = [err.decode(errors="replace")[-800:] for _, err in results if err]
        assert all(p.returncode == 0 for p in procs), errors
        assert 1 == len({out for out, _ in results})


class _Broken(KeyringBackend):
    """A backend that fails and puts the password into its error message."""

    priority = 1

    def get_password(self, service, username):
        return None

    def set_password(self, service, username, password):
        raise KeyringError(f"refused to store {password}")

    def delete_password(self, service, username):
        raise KeyringError("broken")


class _Locked(_Broken):
    def get_password(self, service, username):
        raise KeyringError("collection is locked")


class _FailsOnce(_Broken):
    """Keeps passwords, but its first lookup fails as a busy D-Bus service's can."""

    def __init__(self):
        super().__init__()
        self.failures = 0
        self.stored: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        if self.failures == 0:
            self.failures += 1
            raise KeyringError("No such object path '/org/freedesktop/secrets/collection/login/7'")
        return self.stored.get((service, username))

    def set_password(self, service, username, password):
        self.stored[(service, username)] = password


class TestKeyUnavailable:
    """No usable keyring is a clear KeyUnavailable, never key material."""

    def test_fail_backend(self, tmp_path):
        """keyring's fail backend: the message says how to get a backend."""
        with pytest.raises(KeyUnavailable) as info:
            KeyStore(VaultHome.resolve(tmp_path), fail.Keyring()).data_key()
        assert "PYTHON_KEYRING_BACKEND=vault.store.keyring_backend.FileKeyring" in info.value.message

    def test_backend_error_is_redacted(self, tmp_path):
        """A backend error quoting the key is reported without the key."""
        with pytest.raises(KeyUnavailable) as info:
            KeyStore(VaultHome.resolve(tmp_path), _Broken()).data_key()
        assert "cannot store the data key" in info.value.message
        assert "[redacted]" in info.value.message

    def test_one_failed_read_is_tried_again(self, tmp_path):
        """A Secret Service lookup that fails once (another client's write) does not fail the key."""
        backend = _FailsOnce()
        keystore = KeyStore(VaultHome.resolve(tmp_path), backend)
        key = keystore.data_key()
        assert key == KeyStore(VaultHome.resolve(tmp_path), backend).data_key()
        assert backend.failures == 1

    def test_read_error(self, tmp_path):
        """A backend that cannot read (locked collection) is KeyUnavailable."""
        with pytest.raises(KeyUnavailable, match="collection is locked"):
            KeyStore(VaultHome.resolve(tmp_path), _Locked()).derive("audit")

    def test_destroy_without_keyring(self, tmp_path):
        """Removing a home where no keyring works has no key to forget: no error."""
        KeyStore(VaultHome.resolve(tmp_path), fail.Keyring()).destroy()

    def test_backend_that_forgets(self, tmp_path):
        """keyring's null backend accepts the key and forgets it: refused."""
        with pytest.raises(KeyUnavailable, match="did not keep"):
            KeyStore(VaultHome.resolve(tmp_path), null.Keyring()).data_key()

    def test_malformed_key(self, tmp_path):
        """A key that is not 32 base64 bytes is refused without quoting it."""
        ring = FileKeyring(tmp_path / "kr")
        keystore = KeyStore(VaultHome.resolve(tmp_path / "h"), ring)
        ring.set_password(SERVICE, keystore.username, "CANARY-not-base64!")
        with pytest.raises(KeyUnavailable) as info:
            keystore.data_key()
        assert "malformed" in info.value.message and "CANARY" not in info.value.message


class TestCredentialStore:
    """Named credentials, encrypted in the home, readable only with the key."""

    def test_set_get_list_remove(self, backend):
        """The round trip a user does: set, get, list, rm."""
        home, _, store = backend.vault()
        value = canary()
        store.set("GH_TOKEN", value)
        store.set("api.key-2", "other")
        assert value == store.get("GH_TOKEN").reveal()
        assert ["GH_TOKEN", "api.key-2"] == [i.name for i in store.list()]
        store.remove("GH_TOKEN")
        assert ["api.key-2"] == [i.name for i in store.list()]
        with pytest.raises(MissingCredential):
            store.get("GH_TOKEN")

    def test_persists_across_instances(self, backend):
        """A second store on the same home (another process) reads the values."""
        home, _, store = backend.vault()
        store.set("A", "va")
        assert "va" == CredentialStore(home, KeyStore(home, backend.keyring)).get("A").reveal()

    def test_reads_fresh_each_time(self, backend):
        """A value set elsewhere after this store was used is seen at its next get."""
        home, keystore, store = backend.vault()
        store.set("A", "old")
        assert "old" == store.get("A").reveal()
        CredentialStore(home, KeyStore(home, backend.keyring)).set("A", "new")
        assert "new" == store.get("A").reveal()

    def test_dates(self, backend):
        """created stays at the first set; updated moves with each set."""
        ticks = iter([1_000.0, 2_000.0])
        _, _, store = backend.vault(clock=lambda: next(ticks))
        store.set("A", "1")
        store.set("A", "2")
        [info] = store.list()
        assert (1_000.0, 2_000.0) == (info.created.timestamp(), info.updated.timestamp())
        assert isinstance(info, CredentialInfo)

    def test_missing_message(self, backend):
        """A missing credential says how to set it."""
        _, _, store = backend.vault()
        with pytest.raises(MissingCredential) as info:
            store.get("NOPE")
        expected = "credential 'NOPE' is not set; set it with: vaultsim secret set NOPE"
        assert expected == info.value.message
        with pytest.raises(MissingCredential):
            store.remove("NOPE")

    def test_not_on_disk(self, backend):
        """The value is in no file of the home or the keyring's storage."""
        home, _, store = backend.vault()
        value = canary()
        store.set("TOKEN", value)
        store.set("TOKEN2", value + "-2")
        backend.assert_not_on_disk(home, value)
        backend.assert_not_on_disk(home, "TOKEN2")  # names are encrypted too

    def test_modes(self, backend):
        """The credentials file is 0600 and the home 0700."""
        home, _, store = backend.vault()
        old = os.umask(0)
        try:
            store.set("A", "v")
        finally:
            os.umask(old)
        assert 0o600 == stat.S_IMODE(home.credentials_file.stat().st_mode)
        assert 0o700 == stat.S_IMODE(home.root.stat().st_mode)

    def test_fresh_nonce_per_write(self, backend):
        """Writing the same table twice gives different ciphertexts."""
        home, _, store = backend.vault()
        store.set("A", "v")
        first = json.loads(home.credentials_file.read_text())
        store.set("A", "v")
        second = json.loads(home.credentials_file.read_text())
        assert first["nonce"] != second["nonce"] and first["ct"] != second["ct"]

    @pytest.mark.parametrize(
        "bad", ["", "a b", "a/b", "x" * 65, "ünï", "CANARY-x!", None],
        ids=["empty", "space", "slash", "too-long", "non-ascii", "punct", "none"],
    )
    def test_bad_names(self, backend, bad):
        """Names outside [A-Za-z0-9_.-]{1,64} are BadInput that does not echo them."""
        _, _, store = backend.vault()
        for call in (lambda: store.set(bad, "v"), lambda: store.get(bad), lambda: store.remove(bad)):
            with pytest.raises(BadInput) as info:
                call()
            assert "CANARY" not in info.value.message

    @pytest.mark.parametrize("bad", ["", 42, b"bytes"], ids=["empty", "int", "bytes"])
    def test_bad_values(self, backend, bad):
        """An empty or non-text value is BadInput."""
        _, _, store = backend.vault()
        with pytest.raises(BadInput):
            store.set("A", bad)

    def test_accepts_secret(self, backend):
        """A Secret can be stored as is."""
        _, _, store = backend.vault()
        store.set("A", Secret("wrapped"))
        assert Secret("wrapped") == store.get("A")

    def test_repr_and_errors_carry_no_value(self, backend):
        """Neither the store's repr nor its errors show a value."""
        _, _, store = backend.vault()
        value = canary()
        store.set("A", value)
        texts = [repr(store), str(store), repr(store.get("A")), repr(store.list())]
        with pytest.raises(MissingCredential) as info:
            store.get("B")
        texts.append(str(info.value))
        assert not [t for t in texts if value in t]


class TestCorruptFile:
    """A damaged or foreign credentials file is a clear CredentialError."""

    @pytest.mark.parametrize(
        "damage",
        [lambda raw: b"CANARY garbage", lambda raw: raw[: len(raw) // 2],
         lambda raw: raw.replace(b'"ct": "', b'"ct": "AAAA'),
         lambda raw: raw.replace(b"vaultsim-credentials/1", b"vaultsim-credentials/9")],
        ids=["garbage", "truncated", "ciphertext-changed", "format-changed"],
    )
    def test_damaged(self, backend, damage):
        """Each kind of damage gives a CredentialError naming the file, no traceback data."""
        home, _, store = backend.vault()
        value = canary()
        store.set("A", value)
        home.credentials_file.write_bytes(damage(home.credentials_file.read_bytes()))
        with pytest.raises(CredentialError) as info:
            store.get("A")
        message = info.value.message
        assert "credentials.enc" in message and value not in message and "CANARY" not in message
        assert info.value.__cause__ is None and info.value.__suppress_context__

    def test_other_homes_key(self, backend):
        """A file copied from another home does not decrypt with this home's key."""
        home_a, _, store_a = backend.vault("a")
        home_b, _, store_b = backend.vault("b")
        store_a.set("A", "va")
        store_b.set("B", "vb")
        home_b.credentials_file.write_bytes(home_a.credentials_file.read_bytes())
        with pytest.raises(CredentialError, match="cannot decrypt"):
            store_b.list()

    def test_key_lost(self, backend):
        """With the key gone, an existing file is KeyUnavailable and no new key is minted."""
        home, keystore, store = backend.vault()
        store.set("A", "v")
        keystore.destroy()
        fresh = KeyStore(home, backend.keyring)
        with pytest.raises(KeyUnavailable, match="no data key"):
            CredentialStore(home, fresh).get("A")
        assert backend.keyring.get_password(SERVICE, keystore.username) is None


class TestSecretCli:
    """`vaultsim secret` in a real subprocess, value on stdin."""

    def test_set_then_list(self, backend):
        """set reads stdin; list shows the name and dates, never the value."""
        home, keystore, store = backend.vault()
        env = backend.cli_env(home)
        value = canary()
        done = run_cli(env, "secret", "set", "GH_TOKEN", stdin=value + "\n")
        assert 0 == done.returncode, done.stderr
        assert value == store.get("GH_TOKEN").reveal()  # exactly one newline stripped
        listed = run_cli(env, "secret", "list")
        assert 0 == listed.returncode and "GH_TOKEN" in listed.stdout
        as_json = run_cli(env, "secret", "list", "--json")
        assert ["GH_TOKEN"] == [e["name"] for e in json.loads(as_json.stdout)]
        for out in (done, listed, as_json):
            assert value not in out.stdout + out.stderr
        backend.assert_not_on_disk(home, value)

    def test_home_flag(self, backend, tmp_path):
        """--home overrides $VAULTSIM_HOME."""
        home, _, store = backend.vault("elsewhere")
        env = backend.cli_env(VaultHome.resolve(tmp_path / "unused"))
        backend.cli_env(home)  # cleanup of the key the child creates
        assert 0 == run_cli(env, "secret", "set", "A", "--home", str(home.root), stdin="v").returncode
        assert "v" == store.get("A").reveal()

    def test_only_one_newline_stripped(self, backend):
        """A value ending in newlines keeps all but the last one."""
        home, _, store = backend.vault()
        assert 0 == run_cli(backend.cli_env(home), "secret", "set", "A", stdin="v\n\n").returncode
        assert "v\n" == store.get("A").reveal()

    @pytest.mark.parametrize(
        "args, stdin",
        [(["set", "bad name!"], "CANARY-x"), (["set", "A"], ""), (["set", "A"], "\n"),
         (["set", "A"], b"\xff\xfe"), (["rm", "../x"], ""), (["bogus"], "")],
        ids=["bad-name", "empty", "only-newline", "not-utf8", "rm-bad-name", "bad-action"],
    )
    def test_bad_input_exits_2(self, backend, args, stdin):
        """Bad names, empty or undecodable values exit 2 and echo nothing of the value."""
        home, _, _ = backend.vault()
        done = run_cli(backend.cli_env(home), "secret", *args, stdin=stdin)
        assert 2 == done.returncode
        assert "CANARY" not in done.stdout + done.stderr
        assert not home.credentials_file.exists()

    def test_rm(self, backend):
        """rm removes; removing again is a clear error, exit 1."""
        home, _, store = backend.vault()
        env = backend.cli_env(home)
        store.set("A", "v")
        assert 0 == run_cli(env, "secret", "rm", "A").returncode
        assert [] == store.list()
        again = run_cli(env, "secret", "rm", "A")
        assert 1 == again.returncode and "credential 'A' is not set" in again.stderr

    def test_unloadable_backend(self, backend):
        """A keyring backend that cannot load is a clear error, exit 1, no traceback."""
        home, _, _ = backend.vault()
        env = {**backend.cli_env(home), "PYTHON_KEYRING_BACKEND": "no.such.Backend"}
        done = run_cli(env, "secret", "set", "A", stdin="v")
        assert 1 == done.returncode and "keyring could not load a backend" in done.stderr
        assert "Traceback" not in done.stderr

    def test_concurrent_sets(self, backend):
        """Parallel `secret set` on a fresh home lose no credential (locks)."""
        home, _, store = backend.vault()
        env = backend.cli_env(home)
        procs = [
            subprocess.Popen([PYTHON, "-m", "vault.cli.main", "secret", "set", f"C{i}"], env=env,
                             cwd=ROOT, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
            for i in range(6)
        ]
        for i, proc in enumerate(procs):
            proc.communicate(f"value-{i}".encode(), timeout=60)
        assert [0] * 6 == [p.returncode for p in procs]
        assert [f"value-{i}" for i in range(6)] == [store.get(f"C{i}").reveal() for i in range(6)]

    def test_prompts_on_a_tty(self, backend):
        """On a terminal the value is asked with echo off, and stored."""
        home, _, store = backend.vault()
        master, slave = pty.openpty()

        def take_terminal() -> None:  # the pty becomes the child's controlling tty
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        proc = subprocess.Popen(
            [PYTHON, "-m", "vault.cli.main", "secret", "set", "TTY_TOKEN"], env=backend.cli_env(home),
            cwd=ROOT, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
            preexec_fn=take_terminal,
        )
        os.close(slave)
        value = canary()
        try:
            seen = _read_until(master, b"value for TTY_TOKEN: ")
            os.write(master, value.encode() + b"\n")
            seen += _read_until(master, None)
            assert 0 == proc.wait(timeout=60)
        finally:
            os.close(master)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert value not in seen.decode(errors="replace")  # echo was off
        assert value == store.get("TTY_TOKEN").reveal()


def _read_until(fd: int, marker: bytes | None, timeout: float = 30.0) -> bytes:
    """Read a pty until `marker` (or EOF when None), with a deadline."""
    deadline = time.monotonic() + timeout
    buf = b""
    while marker is None or marker not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"timed out waiting for {marker!r}; got {buf!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 1024)
        except OSError:  # EIO: the child closed the terminal
            chunk = b""
        if not chunk:
            assert marker is None, f"EOF before {marker!r}; got {buf!r}"
            break
        buf += chunk
    return buf
