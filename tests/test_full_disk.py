"""Nothing is lost on a failing disk: every private file is written all or nothing.

Three ways a write fails here, all real or as close as a test can get:
  * a real full disk: a small tmpfs mounted for the test (root only; skipped
    with the reason where mounting is not permitted), filled to the last page;
  * a real write that fails midway without a mount: RLIMIT_FSIZE makes the
    kernel accept part of a write and refuse the rest (EFBIG), exactly the
    short-write-then-error pattern of a device that fills mid-way;
  * injected failures (a short write, a failing fsync, close or rename), in
    process, for the steps no real device fails on cue.
Each test checks what a user would: the old content still reads back, no
temp file is left, the command says why in one line and exits non-zero.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import PY, ROOT, Sandbox, new_sandbox
from vault import atomic
from vault.atomic import NotDurable, write_private
from vault.daemon.diagnostics import Diagnostics
from vault.home import VaultHome
from vault.daemon.instance import approver_token
from vault.store.keyring_backend import FileKeyring
from vault.store.keystore import KeyStore
from vault.store.credentials import CredentialStore

BIG = "v" * 9000  # a credential whose table no longer fits in what is left


def temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*.tmp"))


# -- a real, small, full disk ---------------------------------------------------------


class SmallDisk:
    """A tmpfs of a few hundred KiB, and a way to fill it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.filler = root / "filler"

    def fill(self, leave_pages: int = 0) -> None:
        """Fill every block, then give back `leave_pages` pages (4 KiB each)."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            chunk = b"\0" * 65536
            while True:
                try:
                    if os.write(fd, chunk) == 0:
                        break
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    if len(chunk) == 1:
                        break
                    chunk = chunk[: len(chunk) // 2]
        finally:
            os.close(fd)
        if leave_pages:
            size = self.filler.stat().st_size
            os.truncate(self.filler, max(0, size - size % 4096 - leave_pages * 4096))

    def free(self) -> int:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize


def mount_small_disk(where: Path, size: str = "512k") -> SmallDisk:
    where.mkdir(mode=0o700)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                              capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount(8) here (Debian: apt-get install mount)")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): "
                    f"{done.stderr.strip() or done.returncode}")
    return SmallDisk(where)


@pytest.fixture
def box() -> Iterator[Sandbox]:
    """A sandbox (short paths: the daemon's sockets must fit) with a tmpfs at `disk/`."""
    sandbox = new_sandbox()
    disk = None
    try:
        disk = mount_small_disk(sandbox.root / "disk")
        sandbox.disk = disk  # type: ignore[attr-defined]
        yield sandbox
    finally:
        sandbox.close()
        if disk is not None:
            subprocess.run(["umount", "-l", str(disk.root)], capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", str(sandbox.root)], capture_output=True)


def on_disk_env(box: Sandbox) -> dict[str, str]:
    return {**box.env, "VAULTSIM_HOME": str(box.disk.root / "h")}  # type: ignore[attr-defined]


def vaultsim(box: Sandbox, *args: str, input: str | None = None,
             **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "vault.cli.main", *args], input=input, env=on_disk_env(box), cwd=ROOT,
                          capture_output=True, text=True, timeout=60, **kw)  # type: ignore[arg-type]


def store_of(box: Sandbox) -> CredentialStore:
    home = VaultHome(box.disk.root / "h")  # type: ignore[attr-defined]
    return CredentialStore(home, KeyStore(home, FileKeyring(box.root / "kr")))


class TestSecretSetOnAFullDisk:
    @pytest.mark.parametrize("leave_pages", [0, 1], ids=["no-room-at-all", "room-for-half"])
    def test_old_credentials_survive(self, box: Sandbox, leave_pages: int) -> None:
        """`secret set` that cannot fit fails (exit 1, one line naming the file and the cause);
        every credential stored before still decrypts, and no temp file is left. With one
        page left the kernel takes part of the write: the old code called that done."""
        for name, value in (("A", "alpha-value"), ("B", "beta-value")):
            assert 0 == vaultsim(box, "secret", "set", name, input=value).returncode
        box.disk.fill(leave_pages)  # type: ignore[attr-defined]
        out = vaultsim(box, "secret", "set", "C", input=BIG)
        assert 1 == out.returncode
        assert "No space left on device" in out.stderr and "credentials.enc" in out.stderr
        assert "unchanged" in out.stderr
        assert "Traceback" not in out.stderr and 1 == len(out.stderr.strip().splitlines())
        store = store_of(box)
        assert ("alpha-value", "beta-value") == (store.get("A").reveal(), store.get("B").reveal())
        assert ["A", "B"] == [i.name for i in store.list()]
        assert [] == temp_files(box.disk.root)  # type: ignore[attr-defined]

    def test_set_works_again_once_there_is_room(self, box: Sandbox) -> None:
        """After room is made, the same command succeeds: nothing was left half-done."""
        assert 0 == vaultsim(box, "secret", "set", "A", input="alpha-value").returncode
        box.disk.fill()  # type: ignore[attr-defined]
        assert 1 == vaultsim(box, "secret", "set", "C", input=BIG).returncode
        box.disk.filler.unlink()  # type: ignore[attr-defined]
        assert 0 == vaultsim(box, "secret", "set", "C", input=BIG).returncode
        assert BIG == store_of(box).get("C").reveal()


class TestOtherPrivateFilesOnAFullDisk:
    def test_keyring_file(self, box: Sandbox) -> None:
        """The embedded keyring's file keeps every key when an update cannot fit."""
        ring = FileKeyring(box.disk.root / "kr")  # type: ignore[attr-defined]
        ring.set_password("vaultsim", "data-key:a", "old-key")
        before = ring.path.read_bytes()
        box.disk.fill(leave_pages=1)  # type: ignore[attr-defined]
        from keyring.errors import PasswordSetError
        with pytest.raises(PasswordSetError, match="No space left on device"):
            ring.set_password("vaultsim", "data-key:b", "k" * 20000)
        assert before == ring.path.read_bytes()
        assert "old-key" == ring.get_password("vaultsim", "data-key:a")
        assert [] == temp_files(box.disk.root)  # type: ignore[attr-defined]

    def test_diagnostics(self, box: Sandbox) -> None:
        """A diagnostic that cannot be written is not written at all: no half file, no temp."""
        diags = Diagnostics(box.disk.root / "diagnostics", os.urandom(32))  # type: ignore[attr-defined]
        kept = diags.record({"status": 500, "body": "first"})
        box.disk.fill(leave_pages=1)  # type: ignore[attr-defined]
        with pytest.raises(OSError) as caught:
            diags.record({"status": 500, "body": os.urandom(30000).hex()})
        assert errno.ENOSPC == caught.value.errno
        assert [f"{kept}.diag"] == sorted(p.name for p in diags.directory.iterdir())
        assert "first" == diags.load(kept)["body"]

    def test_approver_token(self, box: Sandbox) -> None:
        """No token file at all rather than an empty one an approver could match with ''."""
        home = VaultHome(box.disk.root / "h").ensure()  # type: ignore[attr-defined]
        box.disk.fill()  # type: ignore[attr-defined]
        with pytest.raises(OSError) as caught:
            approver_token(home)
        assert (errno.ENOSPC, str(home.approver_token_file)) == (caught.value.errno, caught.value.filename)
        assert not home.approver_token_file.exists()
        assert [] == temp_files(home.root)


class TestDaemonStartOnAFullDisk:
    @pytest.mark.parametrize("mode", [["--foreground"], []], ids=["foreground", "background"])
    def test_one_line_exit_2(self, box: Sandbox, mode: list[str]) -> None:
        """A daemon that cannot write its pid file says so in one line and exits 2; nothing
        keeps running and no traceback is shown."""
        assert 0 == vaultsim(box, "secret", "set", "A", input="alpha-value").returncode
        box.disk.fill()  # type: ignore[attr-defined]
        out = vaultsim(box, "daemon", *mode, "--unlocked")
        assert 2 == out.returncode, out.stderr
        assert "Traceback" not in out.stderr and 1 == len(out.stderr.strip().splitlines()), out.stderr
        assert "cannot start" in out.stderr and "No space left on device" in out.stderr
        assert not (box.disk.root / "h" / "agent.sock").exists()  # type: ignore[attr-defined]
        assert [] == temp_files(box.disk.root)  # type: ignore[attr-defined]


# -- a real write that fails midway, without a mount -----------------------------------


def limited_to(nbytes: int):  # type: ignore[no-untyped-def]
    """preexec_fn: the kernel refuses to grow any file past `nbytes` (EFBIG, after a short
    write that takes what fits); SIGXFSZ is ignored, as Python does by default."""
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return apply


class TestWriteThatFailsMidway:
    def test_secret_set_keeps_old_credentials(self, sandbox: Sandbox) -> None:
        """The kernel takes 4 KiB of the new table and refuses the rest: `secret set` fails,
        the credentials stored before still decrypt, no temp file is left."""
        sandbox.set_secret("A", "alpha-value")
        before = (sandbox.home / "credentials.enc").read_bytes()
        out = subprocess.run([PY, "-m", "vault.cli.main", "secret", "set", "C"], input=BIG, env=sandbox.env,
                             cwd=ROOT, capture_output=True, text=True, timeout=60,
                             preexec_fn=limited_to(4096))
        assert 1 == out.returncode
        assert "File too large" in out.stderr and "Traceback" not in out.stderr
        assert before == (sandbox.home / "credentials.enc").read_bytes()
        home = VaultHome(sandbox.home)
        store = CredentialStore(home, KeyStore(home, FileKeyring(sandbox.root / "kr")))
        assert "alpha-value" == store.get("A").reveal()
        assert [] == temp_files(sandbox.home)


class TestInjectedFailures:
    """The steps of write_private, each failing in turn, in process."""

    @pytest.fixture
    def target(self, tmp_path: Path) -> Path:
        path = tmp_path / "credentials.enc"
        write_private(path, b"old content")
        return path

    def test_short_writes_are_continued(self, target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A device that takes 3 bytes a call still gets every byte."""
        real = os.write
        monkeypatch.setattr(atomic.os, "write", lambda fd, data: real(fd, bytes(data[:3])))
        write_private(target, b"new content, longer than three bytes")
        assert b"new content, longer than three bytes" == target.read_bytes()

    def test_write_that_makes_no_progress_is_a_full_device(self, target: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
        """os.write returning 0 forever would loop: it is ENOSPC, and the old file stays."""
        monkeypatch.setattr(atomic.os, "write", lambda fd, data: 0)
        with pytest.raises(OSError) as caught:
            write_private(target, b"new")
        assert (errno.ENOSPC, str(target)) == (caught.value.errno, caught.value.filename)
        assert b"old content" == target.read_bytes() and [] == temp_files(target.parent)

    def test_write_failing_midway(self, target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Part of the data taken, then ENOSPC: the old file stays, no temp file, and the
        error names the target (not the temp file)."""
        real = os.write
        calls = {"n": 0}

        def filling(fd: int, data: bytes) -> int:
            calls["n"] += 1
            if calls["n"] == 1:
                return real(fd, bytes(data[:2]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(atomic.os, "write", filling)
        with pytest.raises(OSError) as caught:
            write_private(target, b"new content")
        monkeypatch.undo()
        assert (errno.ENOSPC, str(target)) == (caught.value.errno, caught.value.filename)
        assert b"old content" == target.read_bytes() and [] == temp_files(target.parent)

    @pytest.mark.parametrize("step", ["fsync", "close", "replace"])
    def test_each_failing_step_keeps_the_old_file(self, target: Path, monkeypatch: pytest.MonkeyPatch,
                                                   step: str) -> None:
        """fsync, close (which reports deferred write errors on some filesystems) or the
        rename failing: the old content stays and no temp file is left."""
        real = getattr(os, step)

        def failing(*args: object) -> None:
            if step == "close":
                real(*args)  # the descriptor really is closed; the close reports the error
            raise OSError(errno.EIO, "injected")
        monkeypatch.setattr(atomic.os, step, failing)
        with pytest.raises(OSError) as caught:
            write_private(target, b"new content")
        monkeypatch.undo()
        assert (errno.EIO, str(target)) == (caught.value.errno, caught.value.filename)
        assert b"old content" == target.read_bytes() and [] == temp_files(target.parent)

    def test_failed_directory_sync_is_reported(self, target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The rename happened but its directory could not be synced: said, not hidden."""
        monkeypatch.setattr(atomic, "fsync_dir", lambda d: (_ for _ in ()).throw(OSError(errno.EIO, "io")))
        with pytest.raises(NotDurable) as caught:
            write_private(target, b"new content")
        assert b"new content" == target.read_bytes()
        assert "may not survive a crash" in atomic.failure(target, caught.value)

    def test_interrupted_write_leaves_no_temp(self, target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Ctrl-C in the middle of a write: old content, no temp file."""
        def interrupted(fd: int) -> None:
            raise KeyboardInterrupt
        monkeypatch.setattr(atomic.os, "fsync", interrupted)
        with pytest.raises(KeyboardInterrupt):
            write_private(target, b"new content")
        monkeypatch.undo()
        assert b"old content" == target.read_bytes() and [] == temp_files(target.parent)

    def test_mode_and_symlink(self, tmp_path: Path) -> None:
        """The file is 0600 whatever the umask; a symlink at the target is replaced, never
        followed, so the file it pointed to is untouched."""
        victim = tmp_path / "victim"
        victim.write_text("keep")
        link = tmp_path / "approver.token"
        link.symlink_to(victim)
        old = os.umask(0)
        try:
            write_private(link, b"token")
        finally:
            os.umask(old)
        assert "keep" == victim.read_text()
        assert not link.is_symlink() and b"token" == link.read_bytes()
        assert 0o600 == stat.S_IMODE(link.stat().st_mode)

    def test_store_reports_and_keeps(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Through the credential store: a CredentialError that names the cause, the old
        table still readable by a fresh store."""
        from vault.errors import CredentialError
        home = VaultHome(tmp_path / "h")
        ring = FileKeyring(tmp_path / "kr")
        store = CredentialStore(home, KeyStore(home, ring))
        store.set("A", "alpha-value")
        real = os.write
        calls = {"n": 0}

        def filling(fd: int, data: bytes) -> int:
            calls["n"] += 1
            if calls["n"] == 1:
                return real(fd, bytes(data[:100]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(atomic.os, "write", filling)
        with pytest.raises(CredentialError, match="No space left on device.*unchanged"):
            store.set("B", "beta-value")
        monkeypatch.undo()
        fresh = CredentialStore(home, KeyStore(home, ring))
        assert ("alpha-value", ["A"]) == (fresh.get("A").reveal(), [i.name for i in fresh.list()])
        assert [] == temp_files(home.root)


def test_dev_full_is_a_full_device() -> None:
    """write_all on /dev/full raises ENOSPC (a real device that is always full)."""
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        with pytest.raises(OSError) as caught:
            atomic.write_all(fd, b"x" * 10)
    finally:
        os.close(fd)
    assert errno.ENOSPC == caught.value.errno
