"""vaultsim: an approval and credential vault simulator for testing AI agents.

The `vault` package is the core: daemon, credential store, gate, executors,
fake remote, audit log, scenario runner and CLI. It never imports `textual`.
"""

__version__ = "0.1.0"
