"""The daemon's seams hold: the gate knows no wire, the APIs never see the daemon, no import circle.

Read from the source (every import statement, also inside functions and under
TYPE_CHECKING), so a shortcut taken anywhere in a module fails here.
"""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

import vault

VAULT = Path(vault.__file__).resolve().parent
# the daemon's parts: none may import another in a circle
PARTS = {"vault.daemon.daemon", "vault.daemon.agent_api", "vault.daemon.approver_api", "vault.daemon.calls", "vault.daemon.agent_sessions",
         "vault.daemon.recorder", "vault.daemon.approver_hub", "vault.daemon.approver_guard", "vault.daemon.rpc_server", "vault.daemon.sessions",
         "vault.daemon.processes", "vault.daemon.peer", "vault.gate.engine", "vault.gate.approvals", "vault.gate.grants",
         "vault.gate.policy", "vault.gate.stats", "vault.gate.fatigue"}
WIRE = {"vault.jsonrpc", "vault.daemon.rpc_server", "vault.daemon.line_socket", "vault.daemon.approver_hub", "vault.client"}


def module_name(path: Path) -> str:
    rel = path.relative_to(VAULT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def source(name: str) -> Path:
    path = VAULT.parent / (name.replace(".", "/") + ".py")
    return path if path.exists() else VAULT.parent / name.replace(".", "/") / "__init__.py"


def imports_of(name: str) -> set[str]:
    """Every vault module `name` imports (`from . import x` counts as importing x)."""
    path = source(name)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("vault"))
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("vault"):
                continue
            out.add(target)
            for a in node.names:  # `from . import jsonrpc`: a module, not a name
                sub = f"{target}.{a.name}"
                if (VAULT.parent / (sub.replace(".", "/") + ".py")).exists():
                    out.add(sub)
    return out


def all_modules() -> list[str]:
    return sorted(module_name(p) for p in VAULT.rglob("*.py"))


def imported_names(name: str) -> set[str]:
    path = source(name)
    return {a.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) for a in node.names}


class TestTheGateKnowsNoWire:
    @pytest.mark.parametrize("module", [m for m in all_modules() if m.startswith("vault.gate")])
    def test_no_gate_module_imports_json_rpc_or_the_approver_hub(self, module: str) -> None:
        """The gate decides; the wire (frames, connections, codes, subscribers) is another layer's."""
        assert not imports_of(module) & WIRE, imports_of(module) & WIRE
        assert not imported_names(module) & {"Connection", "RpcError", "ApproverHub", "Dispatcher"}

    @pytest.mark.parametrize("module", ["vault.store.credentials", "vault.store.keystore", "vault.store.keyring_backend", "vault.store.secret"])
    def test_the_credential_store_imports_no_json_rpc_either(self, module: str) -> None:
        assert not imports_of(module) & WIRE, imports_of(module) & WIRE

    def test_the_gates_refusals_are_domain_errors_the_rpc_layer_maps_to_codes(self) -> None:
        from vault import jsonrpc
        from vault.errors import Conflict, NotAuthorized, Refused, RpcError
        from vault.daemon.rpc_server import rpc_code
        assert not issubclass(Conflict, RpcError) and not issubclass(NotAuthorized, RpcError)
        assert rpc_code(Conflict("settled")) == jsonrpc.CONFLICT == -32003
        assert rpc_code(NotAuthorized("not yours")) == jsonrpc.NOT_AUTHORIZED == -32001
        assert rpc_code(Refused("no")) == jsonrpc.INVALID_PARAMS


class TestComposedDaemon:
    @pytest.mark.parametrize("module", sorted(PARTS - {"vault.daemon.daemon"}))
    def test_no_part_imports_the_daemon(self, module: str) -> None:
        """The parts are given what they need; none reaches back into the daemon."""
        assert "vault.daemon.daemon" not in imports_of(module)

    @pytest.mark.parametrize("module", sorted(PARTS))
    def test_no_part_imports_the_runner(self, module: str) -> None:
        """The runner grades the daemon from outside; the daemon never depends on it."""
        assert not {m for m in imports_of(module) if m.startswith("vault.runner")}

    def test_the_daemons_parts_import_each_other_in_no_circle(self) -> None:
        graph = {m: imports_of(m) & PARTS for m in PARTS}
        seen: dict[str, int] = {}  # 1: on the current path, 2: done

        def visit(m: str, path: list[str]) -> None:
            seen[m] = 1
            for n in sorted(graph[m]):
                if seen.get(n) == 1:
                    pytest.fail("import circle: " + " -> ".join(path[path.index(n):] + [m, n]))
                if n not in seen:
                    visit(n, path + [m])
            seen[m] = 2

        for m in sorted(PARTS):
            if m not in seen:
                visit(m, [])

    def test_the_daemon_is_composed_not_mixed_in(self) -> None:
        from vault.daemon.daemon import VaultDaemon
        from vault.cli.daemon import build_daemon
        assert VaultDaemon.__bases__ == (object,)
        # daemon_cli imports the daemon where it builds one (stop and status need none of it)
        assert inspect.signature(build_daemon).return_annotation in ("VaultDaemon", VaultDaemon)

    @pytest.mark.parametrize("cls_path", ["vault.daemon.agent_api.AgentApi", "vault.daemon.approver_api.ApproverApi",
                                          "vault.daemon.calls.CallService", "vault.gate.engine.Gate"])
    def test_the_seams_constructors_are_typed_without_any(self, cls_path: str) -> None:
        """Each dependency a part is built from has a real type (JSON payloads aside)."""
        module, name = cls_path.rsplit(".", 1)
        cls = getattr(__import__(module, fromlist=[name]), name)
        hints = typing.get_type_hints(cls.__init__)
        params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        assert set(params) <= set(hints), set(params) - set(hints)
        assert all(hints[p] is not typing.Any for p in params), hints
