"""Where vaultsim's shipped files are: package resources, found one way everywhere.

The catalog, the policies, the approver scripts, the plans (the demo's too)
and the scenario suite are kept in the project's top-level `scenarios/` (the
layout users know). In the source tree `vault/scenarios` is a link to it; a
wheel holds a real `vault/scenarios/` (setuptools copies the files through
the link, every subfolder included). So `importlib.resources` finds them the
same way from a checkout, an editable install, a wheel and pipx, and nothing
looks for a checkout next to the installed code.

    shipped()                     the scenario suite (`vaultsim run` with no path)
    shipped("catalog.yaml")       the default operation catalog
    shipped("policies", ...)      policies; ("approvers", ...), ("plans", ...) likewise
    IMPORT_ROOT                   where the `vault` package sits: processes started
                                  there import this same code, installed or not
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from vault.errors import VaultError


def _package_dir() -> Path:
    root = files("vault")
    if not isinstance(root, Path):  # e.g. imported from a zip: the daemon needs real files
        raise VaultError(f"vaultsim must be installed as files on disk, not loaded from {root}")
    return root


def shipped(*parts: str) -> Path:
    """A shipped file or directory (it may not exist: callers report a missing file)."""
    return _package_dir().joinpath("scenarios", *parts).resolve()


IMPORT_ROOT = _package_dir().resolve().parent
SCENARIOS = shipped()
CATALOG = shipped("catalog.yaml")
DEFAULT_POLICY = shipped("policies", "default.yaml")
DEMO_PLAN = shipped("plans", "demo.yaml")
