"""vault.regular: the one way vault reads a file someone else can reach."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from vault import regular


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def test_a_regular_file_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100_000)
    assert regular.read_bytes(path) == b"x" * 100_000


def test_a_fifo_without_a_writer_is_refused_at_once(fifo: Path) -> None:
    # a thread so that a regression hangs the thread, not the test: its result says so
    out: list[BaseException | bytes] = []
    t = threading.Thread(target=lambda: out.append(_catch(lambda: regular.read_bytes(fifo))), daemon=True)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "read_bytes waited on a FIFO for a writer"
    assert isinstance(out[0], regular.NotRegular) and out[0].kind == "a FIFO"
    assert out[0].errno == errno.EINVAL and str(fifo) in str(out[0])


def test_a_directory_and_a_device_are_named(tmp_path: Path) -> None:
    with pytest.raises(regular.NotRegular) as d:
        regular.read_bytes(tmp_path)
    assert d.value.is_dir and d.value.kind == "a directory"
    with pytest.raises(regular.NotRegular) as z:
        regular.read_bytes("/dev/zero", 10)
    assert z.value.kind == "a device" and not z.value.is_dir


def test_a_link_is_followed_only_when_asked(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"kept")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert regular.read_bytes(link) == b"kept"
    with pytest.raises(OSError) as e:
        regular.read_bytes(link, follow=False)
    assert e.value.errno == errno.ELOOP
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    with pytest.raises(regular.NotRegular):  # followed, still not a regular file: not read without end
        regular.read_bytes(zero)


def test_the_limit_refuses_or_cuts(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"a" * 11)
    assert regular.read_bytes(path, 11) == b"a" * 11
    with pytest.raises(regular.TooLarge) as e:
        regular.read_bytes(path, 10)
    assert e.value.errno == errno.EFBIG and e.value.limit == 10
    assert regular.read_bytes(path, 4, cut=True) == b"aaaa"


def test_open_fd_is_blocking_and_closed_on_refusal(fifo: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(regular.NotRegular):
        regular.open_fd(fifo)
    assert len(os.listdir("/proc/self/fd")) == before
    path = fifo.with_name("f")
    path.write_bytes(b"")
    fd = regular.open_fd(path)
    try:
        assert os.get_blocking(fd)
    finally:
        os.close(fd)


def _catch(fn):  # type: ignore[no-untyped-def]
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        return exc
