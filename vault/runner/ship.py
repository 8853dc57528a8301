"""What a trial needs on another machine, staged into one Ray `working_dir`.

A scenario names files relative to itself (policy, approver script, plans,
steps), a scenario's agent command runs beside its file, and `--agent CMD`
runs where `vaultsim run` was started. A node has vaultsim installed and
nothing else of the user's, so the driver copies exactly those folders into
one directory that Ray packs, uploads and unpacks on each node as the
workers' current directory (`runtime_env={"working_dir": ...}`):

    <stage>/files/<absolute path on the driver>/...

    each scenario file's folder (recursively; the topmost of nested ones),
    any referenced file outside those folders, and the `--agent` cwd

On a node, `remap(path)` turns a driver path into its copy, so a scenario's
`relative()` and the agent's cwd mean there what they meant on the driver.
Version control, virtualenvs and caches are left out; more than
`MAX_BYTES` to ship is refused (a home directory as the `--agent` cwd is a
mistake, not a suite).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from vault.errors import BadInput
from vault.runner.scenario import Case, Scenario

FILES = "files"
MAX_BYTES = 256 * 1024 * 1024  # a working_dir is uploaded to every job: a home directory is a mistake
IGNORE = shutil.ignore_patterns(".git", ".hg", ".venv", "venv", "__pycache__", "*.pyc", "node_modules",
                                ".mypy_cache", ".pytest_cache", ".tox", "*.egg-info")


def referenced(sc: Scenario) -> set[Path]:
    """Every file a scenario names (they exist: the loader checked)."""
    names: list[str] = []
    if sc.policy:
        names.append(sc.policy)
    if sc.approver is not None and sc.approver.file:
        names.append(sc.approver.file)
    for spec in sc.agents:
        names += [x for x in (spec.plan, spec.steps) if isinstance(x, str)]
    return {sc.relative(n).resolve() for n in names}


def _topmost(dirs: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for d in sorted(set(dirs), key=lambda p: len(p.parts)):
        if not any(d.is_relative_to(top) for top in out):
            out.append(d)
    return out


def stage(cases: list[Case], agent_cwd: str | None) -> Path:
    """A fresh directory holding what the selected cases need on a node; the caller removes it."""
    root = Path(tempfile.mkdtemp(prefix="vaultsim-ship-"))
    scenarios = {id(c.scenario): c.scenario for c in cases}.values()
    folders = [sc.base.resolve() for sc in scenarios]
    if agent_cwd:
        folders.append(Path(agent_cwd).resolve())
    tops = _topmost(folders)
    used = [0]

    def ignore(directory: str, names: list[str]) -> set[str]:
        """Leave out caches and version control, and stop at MAX_BYTES with what was too big."""
        skipped = set(IGNORE(directory, names))
        for name in names:
            path = Path(directory) / name
            if name not in skipped and path.is_file():
                used[0] += path.stat().st_size
        if used[0] > MAX_BYTES:
            raise BadInput(f"--executor ray: the files to ship to the nodes pass {MAX_BYTES >> 20} MiB at "
                           f"{directory} (the scenario folders{' and the --agent directory' if agent_cwd else ''}"
                           f"); run from a smaller directory or keep scenarios in a folder of their own")
        return skipped

    try:
        for folder in tops:
            shutil.copytree(folder, _under(root, folder), ignore=ignore, symlinks=False, dirs_exist_ok=True)
        for sc in scenarios:
            for path in referenced(sc):
                if not any(path.is_relative_to(top) for top in tops):
                    _under(root, path).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, _under(root, path))
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


def _under(root: Path, path: Path) -> Path:
    return root / FILES / path.relative_to(path.anchor)


def remap(path: str | Path, here: Path | None = None) -> Path:
    """A driver path as its staged copy in this worker's working_dir (its current directory)."""
    return _under(here or Path.cwd(), Path(path))


def remap_case(case: Case, here: Path | None = None) -> Case:
    """The case with its scenario file moved to the staged copy: relative names follow it."""
    if case.scenario.path is None:
        return case
    return replace(case, scenario=case.scenario.model_copy(update={"path": remap(case.scenario.path, here)}))
