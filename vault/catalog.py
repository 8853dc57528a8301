"""The operation catalog: what an agent may name, and what the vault does for it.

An agent sends an operation name and parameters, nothing else. The catalog
says the risk class, which executor runs it, the endpoint (method + path
template, or an SSH command template), which credential it uses, and which
response contract its answer must satisfy.
"""

from __future__ import annotations

import re
import string
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import BadInput
from .resources import CATALOG as DEFAULT_CATALOG


class Risk(StrEnum):
    read = "read"
    create = "create"
    update = "update"
    delete = "delete"
    execute = "execute"
    spend = "spend"
    permission = "permission"
    credential = "credential"


DESTRUCTIVE = frozenset({Risk.delete, Risk.execute, Risk.spend, Risk.permission, Risk.credential})

_Strict = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


class ParamSpec(BaseModel):
    model_config = _Strict
    type: Literal["string", "integer", "boolean"] = "string"
    required: bool = True
    # secret-looking values are never echoed into prompts or logs
    summary: bool = True
    # a full-match regex the value must satisfy (required for ssh commands)
    pattern: str | None = None


_PY_TYPES = {"string": str, "integer": int, "boolean": bool}


class Operation(BaseModel):
    model_config = _Strict

    name: str = ""
    risk: Risk
    executor: Literal["http", "ssh"]
    service: str
    credential: str
    description: str = ""
    # http
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] | None = None
    path: str | None = None
    # ssh: a command template; parameters are validated against `pattern`
    command: str | None = None
    params: dict[str, ParamSpec] = Field(default_factory=dict)
    # what a session grant covers: "<operation> on <target>"; may use {params}
    target: str = ""
    # the pydantic contract its response must satisfy (vault.contracts)
    contract: str | None = None
    # whether the remote honours Idempotency-Key for this operation
    idempotent: bool = False
    # the operation an agent calls to reconcile (lookup uses the status endpoint)
    mutates: bool = False

    @model_validator(mode="after")
    def _check(self) -> "Operation":
        if self.executor == "http" and (not self.method or not self.path):
            raise ValueError("http operations need method and path")
        if self.executor == "ssh" and not self.command:
            raise ValueError("ssh operations need a command")
        template = self.path if self.executor == "http" else self.command
        for field in _fields(template or ""):
            if field not in self.params:
                raise ValueError(f"template field {{{field}}} is not a declared parameter")
        return self

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Check an agent's parameters against the spec; raise BadInput naming the field."""
        if not isinstance(params, dict):
            raise BadInput("params must be an object")
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            raise BadInput(f"{self.name}: unknown parameter {unknown[0]!r}")
        for name, spec in self.params.items():
            if name not in params:
                if spec.required:
                    raise BadInput(f"{self.name}: missing parameter {name!r}")
                continue
            value = params[name]
            want = _PY_TYPES[spec.type]
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise BadInput(f"{self.name}: parameter {name!r} must be {spec.type}")
            if want is str and (len(value) > 4096 or not _SAFE_TEXT.fullmatch(value)):
                raise BadInput(f"{self.name}: parameter {name!r} has characters or length not allowed")
            if spec.pattern and not re.fullmatch(spec.pattern, str(value)):
                raise BadInput(f"{self.name}: parameter {name!r} does not match {spec.pattern}")
        return dict(params)

    def scope(self, params: dict[str, Any]) -> str:
        """The resource a session grant for this call covers, in words."""
        target = self.target or self.service
        try:
            target = target.format(**params)
        except (KeyError, IndexError, ValueError):
            pass
        return f"{self.name} on {target}"

    def summary(self, params: dict[str, Any]) -> dict[str, Any]:
        """Parameters as shown to an approver: only those marked safe, truncated."""
        out: dict[str, Any] = {}
        for name, value in params.items():
            spec = self.params.get(name)
            if spec is None or not spec.summary:
                out[name] = "[hidden]"
            else:
                text = str(value)
                out[name] = value if len(text) <= 80 else text[:77] + "..."
        return out


_SAFE_TEXT = re.compile(r"[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*")


def _fields(template: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(template) if f]


class Catalog(BaseModel):
    model_config = _Strict
    operations: dict[str, Operation]

    @model_validator(mode="after")
    def _names(self) -> "Catalog":
        for name, op in self.operations.items():
            object.__setattr__(op, "name", name)
        return self

    def get(self, name: str) -> Operation | None:
        return self.operations.get(name)

    def merged(self, extra: "Catalog | None") -> "Catalog":
        if extra is None:
            return self
        return Catalog(operations={**self.operations, **extra.operations})


# libyaml's safe loader when present: same semantics, several times faster
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_model(path: str | Path, model: type[BaseModel]) -> Any:
    """Load YAML into a pydantic model; errors name the file, the field and why."""
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_YAML_LOADER)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise BadInput(f"{path}:{where} not valid YAML") from None
    except (ValueError, RecursionError):  # e.g. an integer longer than Python converts, or nesting too deep
        raise BadInput(f"{path}: holds a value too large or too deeply nested to read") from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise BadInput(f"{path}: {format_validation_error(exc)}") from None


def format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_input=False, include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        parts.append(f"field {loc}: {err['msg']}")
    return "; ".join(parts)


def load_catalog(path: str | Path | None = None) -> Catalog:
    return load_yaml_model(path or DEFAULT_CATALOG, Catalog)
