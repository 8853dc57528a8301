"""`vaultsim schema result`: the Result model's JSON Schema, for agent authors."""

from __future__ import annotations

import argparse

from .models import result_schema_json


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("which", choices=["result"])


def run(args: argparse.Namespace) -> int:
    print(result_schema_json())
    return 0
