"""A careful agent over a few shipped scenarios chosen for what it does differently.

A whole-suite sweep per agent (42 trials, 1-4 minutes each on 2 cores under load) was most of CI's
growth; each red team's sweeps now run the scenarios that reach its agent's own shape (its
language's process model, its habit), named with the reason in each test file.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from test_redteam_careful import told, vaultsim_run

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "scenarios"


def passes_picked(agent: str, names: tuple[str, ...], *extra: str, timeout: float = 300) -> dict[str, Any]:
    """Run `agent` over the shipped scenarios `names` (jailed unless `extra` says otherwise, two at a
    time) and assert the release: every trial as its scenario expects, each picked one run."""
    paths = [SHIPPED / f"{name}.yaml" for name in names]
    missing = [p.name for p in paths if not p.exists()]
    assert not missing, f"picked scenarios no longer shipped: {missing}"
    with tempfile.TemporaryDirectory(prefix="picked-") as tmp:
        run = vaultsim_run(paths, agent, Path(tmp) / "r.json", "-j", "2", *extra, timeout=timeout)
    assert run["code"] == 0, told(run)
    assert run["json"]["summary"]["release"] == "ok", told(run)
    assert sorted(s["id"] for s in run["json"]["scenarios"]) == sorted(names), told(run)
    return run
