"""Without a jail each trial walks the machine's shared places for what its agents wrote; each
older directory there is looked at once a walk (its lstat, taken when it was found, also says
whether its remembered list of subdirectories still stands), and a file made deep in older
directories after an earlier walk is still found.

Why: the runner's profile without a jail (`vaultsim run --isolation none`) was half lstat calls,
each older directory looked at twice, thousands of them a trial on a host whose /tmp holds a
checkout and its virtualenv.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest

from vault.runner import shared_dirs


def _older_tree(top: Path, width: int = 3, depth: int = 3) -> list[Path]:
    level = [top]
    made = []
    for _ in range(depth):
        level = [d / f"d{i}" for d in level for i in range(width)]
        for d in level:
            d.mkdir()
        made += level
    return made


def test_a_second_walk_looks_at_each_older_directory_once_and_finds_a_file_made_deep(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    top = tmp_path / "shared"
    top.mkdir()
    made = _older_tree(top)
    monkeypatch.setattr(shared_dirs, "SETTLE_S", -1.0)  # remembered at once (their ctimes are this second's)
    since = time.time() + 0.05  # the "agent" started after the tree was made (ctime: a coarse tick later)
    deadline = time.time() + 10
    while time.time() < since + 0.02:  # and before anything below is written
        assert time.time() < deadline
        time.sleep(0.01)
    assert shared_dirs.written([str(top)], since, set())[0] == []  # lists them: remembered

    looked: Counter[str] = Counter()
    lstat = os.lstat

    def counting(path: str | os.PathLike[str], *a: object, **k: object) -> os.stat_result:
        looked[os.fspath(path)] += 1
        return lstat(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "lstat", counting)
    assert shared_dirs.written([str(top)], since, set())[0] == []
    deep = [str(d) for d in made if d.relative_to(top).as_posix().count("/") == 2]
    assert all(looked[d] == 1 for d in deep), {d: looked[d] for d in deep if looked[d] != 1}

    leak = made[-1] / "notes.txt"  # in an older directory three levels down
    leak.write_text("written by the agent")
    assert shared_dirs.written([str(top)], since, set())[0] == [leak]
