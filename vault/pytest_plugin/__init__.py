"""vaultsim's pytest plugin: a real vault world per test, its evidence, and scenario files as tests.

Registered through the `pytest11` entry point (`vault.pytest_plugin.plugin`),
so installing vaultsim is enough:

    def test_release_is_not_deleted(vaultsim):
        vaultsim.approver.deny("delete_release")
        run = vaultsim.run_agent(["python", "my_agent.py"],
                                 task={"goal": "delete release rel-1", "operations": ["delete_release"]})
        vaultsim.assert_effects(delete_release=0)
        vaultsim.assert_verdict("PASS", outcome={"claim": "not_done"})

    plugin.py      hooks, options and fixtures (`vaultsim`, `vaultsim_factory`,
                   the session's `vaultsim_engine`)
    world.py       `Vaultsim`, the object a test drives: approver rules, agents,
                   evidence, grading, assertion helpers
    evidence.py    the evidence as typed objects, and the failure messages
    scenarios.py   scenario YAML files collected as test items (opt-in)
    ungraded.py    a passing test's never-graded worlds, graded at teardown (and a shared
                   world no test graded, as its factory closes)
    setup_notes.py a verdict that is the test's own approver's doing, said so
    warnoptions.py `python -W` options passed on to pytest-xdist's workers

The world itself is the runner's (vault.runner.live): the same set-up, agents
and grading as `vaultsim run`. This package imports nothing heavy until a
fixture is used, since pytest loads the plugin in every run.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AgentResult", "Prompts", "Vaultsim", "VaultsimFactory", "VaultsimUngradedWarning"]


def __getattr__(name: str) -> Any:
    if name in ("Vaultsim", "VaultsimFactory"):
        from vault.pytest_plugin import world
        return getattr(world, name)
    if name == "VaultsimUngradedWarning":
        from vault.pytest_plugin import ungraded
        return ungraded.VaultsimUngradedWarning
    if name in ("AgentResult", "Prompts"):
        from vault.pytest_plugin import evidence
        return getattr(evidence, name)
    raise AttributeError(name)
