"""Shared fixtures: a private sandbox per test with real processes, cleaned up always."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from helpers import Sandbox, new_sandbox

pytest_plugins = ["pytester"]


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    box = new_sandbox()
    try:
        yield box
    finally:
        box.close()
        shutil.rmtree(box.root, ignore_errors=True)
