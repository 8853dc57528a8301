"""The `vaultsim` command line: `cli.main` routes each subcommand to its own module here.

Each module exposes `configure(parser)` and `run(args) -> int` (or named functions for several
commands); nothing outside `vault.cli.main` parses a command line of vaultsim's own.
"""
