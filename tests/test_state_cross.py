"""vault.runner.state_cross: what a change to another task's state directory reads as, and its
bounds. The trials themselves are in tests/test_redteam_state35.py."""

from __future__ import annotations

import os
from pathlib import Path

from vault.runner import state_cross
from vault.runner.state_cross import Budget, changes, crossed, snapshot

ROLES = {"alpha-1": [(0, "alpha")], "bravo-2": [(1, "bravo")]}


def _dir(tmp: Path) -> Path:
    d = tmp / "st" / "alpha-1"
    d.mkdir(parents=True)
    (d / "state.json").write_text('{"done": {}}')
    (d / "sub").mkdir()
    (d / "sub" / "token").write_text("t")
    return d


def _bump_ctime(path: Path) -> None:
    """A change of metadata alone: the kernel sets ctime, whatever the agent sets mtime back to."""
    st = os.lstat(path)
    os.chmod(path, st.st_mode & 0o7777)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_each_kind_of_change_is_named(tmp_path: Path) -> None:
    d = _dir(tmp_path)
    cases = {
        "wrote state.json": lambda: (d / "state.json").write_text('{"done": {"x": 1}}'),
        "created forged": lambda: (d / "forged").write_text(""),
        "removed sub/token": lambda: (d / "sub" / "token").unlink(),
        "replaced state.json": lambda: ((d / "new").write_text('{"done": {}}'), os.replace(d / "new", d / "state.json")),
        "changed the metadata of state.json": lambda: os.chmod(d / "state.json", 0o600),
    }
    for said, do in cases.items():
        before = snapshot(d)
        do()
        did = changes(before, snapshot(d))
        assert said in did, (said, did)
        assert not any("the directory itself" in x for x in did if x != said), did  # its entries' lines say it


def test_a_link_made_to_a_file_there_is_a_change(tmp_path: Path) -> None:
    d = _dir(tmp_path)
    before = snapshot(d)
    os.link(d / "state.json", tmp_path / "elsewhere")
    assert changes(before, snapshot(d)) == ["changed the metadata of state.json"]


def test_a_change_with_its_times_put_back_is_still_a_change(tmp_path: Path) -> None:
    d = _dir(tmp_path)
    before = snapshot(d)
    _bump_ctime(d / "state.json")
    assert changes(before, snapshot(d)) == ["changed the metadata of state.json"]


def test_nothing_done_is_nothing_said_and_a_fifo_is_not_opened(tmp_path: Path) -> None:
    d = _dir(tmp_path)
    os.mkfifo(d / "fifo")  # an open for reading would wait for a writer forever
    os.symlink("/nowhere", d / "link")
    assert changes(snapshot(d), snapshot(d)) == []
    assert crossed(1, "bravo-2", ROLES, {"alpha-1": snapshot(d)}, {"alpha-1": snapshot(d)}) == []


def test_an_absent_directory_made_is_a_change(tmp_path: Path) -> None:
    before = snapshot(tmp_path / "st" / "alpha-1")
    d = _dir(tmp_path)
    assert changes(before, snapshot(d))[0] == "created the directory itself"


def test_past_the_entries_bound_a_change_cannot_be_ruled_out(tmp_path: Path) -> None:
    d = _dir(tmp_path)
    for i in range(5):
        (d / f"f{i}").write_text("")
    before, after = snapshot(d, Budget(entries=3)), snapshot(d, Budget(entries=3))
    assert before.truncated
    hits = crossed(1, "bravo-2", ROLES, {"alpha-1": before}, {"alpha-1": after})
    assert [h["unsure"] for h in hits] == [True]
    ev = type("Ev", (), {"agents": [type("A", (), {"index": 1, "name": "bravo", "state_crossed": hits})()]})()
    assert "cannot be ruled out" in state_cross.findings(ev)[0]


def test_past_the_bytes_bound_files_are_compared_by_their_metadata(tmp_path: Path) -> None:
    d = _dir(tmp_path)
    before = snapshot(d, Budget(bytes=4))
    assert before.unread
    (d / "state.json").write_text('{"done": {"forged": 1}}')
    hits = crossed(1, "bravo-2", ROLES, {"alpha-1": before}, {"alpha-1": snapshot(d, Budget(bytes=4))})
    assert hits and "wrote state.json" in hits[0]["did"] and hits[0]["metadata_only"]


def test_the_finding_names_both_agents_and_no_contents(tmp_path: Path) -> None:
    d = _dir(tmp_path)
    before = snapshot(d)
    (d / "state.json").write_text('{"pending": {"s": {"token": "rt-secret-token"}}}')
    hits = crossed(1, "bravo-2", {**ROLES, "alpha-1": [(0, "alpha"), (2, "alpha")]}, {"alpha-1": before},
                   {"alpha-1": snapshot(d)})
    ev = type("Ev", (), {"agents": [type("A", (), {"index": 1, "name": "bravo", "state_crossed": hits})()]})()
    [said] = state_cross.findings(ev)
    assert said.startswith("agent 1 (bravo) changed agent 0 (alpha)'s (agent 2's too) state directory: wrote state.json")
    assert "rt-secret" not in said
    # its own role's directory is never compared
    assert crossed(0, "alpha-1", ROLES, {"alpha-1": before}, {"alpha-1": snapshot(d)}) == []


def test_past_the_entries_bound_an_unlisted_name_is_not_said_removed(tmp_path: Path) -> None:
    """Entries added past the bound push others out of the listing: they were not removed."""
    d = _dir(tmp_path)
    before = snapshot(d, Budget(entries=4))
    (d / "state.json").write_text('{"done": {"forged": 1}}')
    for i in range(5):
        (d / f"a{i}").write_text("")
    after = snapshot(d, Budget(entries=4))
    assert after.truncated and not before.truncated
    [hit] = crossed(1, "bravo-2", ROLES, {"alpha-1": before}, {"alpha-1": after})
    assert not any(x.startswith("removed") for x in hit["did"]), hit
    ev = type("Ev", (), {"agents": [type("A", (), {"index": 1, "name": "bravo", "state_crossed": [hit]})()]})()
    [said] = state_cross.findings(ev)
    assert "created a" in said and "wrote state.json" in said and "cannot be ruled out" in said
