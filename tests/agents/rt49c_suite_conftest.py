"""Copied as conftest.py by tests/test_redteam_careful49.py. An outside team's conftest: it wraps the plugin's fixtures (docs/ci.md) with its own rules."""

import os
import sys

import pytest

from vault.pytest_plugin import VaultsimFactory

AGENT = os.environ["RT49C_AGENT"]  # the agent under test, named by whoever runs the suite


@pytest.fixture(scope="session")
def agent_cmd():
    return [sys.executable, AGENT]


@pytest.fixture
def world(vaultsim):
    """The plugin's world with the team's approver: creates granted for the session, reads free."""
    vaultsim.approver.allow_session("create_issue")
    yield vaultsim


@pytest.fixture(scope="module")
def shared(vaultsim_engine, tmp_path_factory):
    factory = VaultsimFactory(vaultsim_engine, tmp_path_factory.mktemp("shared"), "shared")
    w = factory()
    w.approver.allow_session("create_issue")
    yield w
    factory.close()


@pytest.fixture(scope="class")
def ledger_before(shared):
    return shared.effects("create_issue")
