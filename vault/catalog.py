"""The operation catalog: what an agent may name, and what the vault does for it.

An agent sends an operation name and parameters, nothing else. The catalog
says the risk class, which executor runs it, the endpoint (method + path
template, or an SSH command template), which credential it uses, and which
response contract its answer must satisfy.

Each parameter declares its type and may narrow it with `pattern` (a regex
the whole value matches), `enum` and `maxLength`, checked before any request;
a bad regex is refused when the catalog loads, naming the operation and the
parameter; in the daemon a value it backtracks on without end is refused after
vault.pattern_budget's bound, not matched on the event loop for ever. Wherever a value goes, vault.param_safety checks it can only name
what the catalog meant (no `..` path segment, no added separator), whatever
the declarations say.
"""

from __future__ import annotations

import functools
import json
import os
import re
import string
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError,
                      field_validator, model_validator)

from vault import param_safety, pattern_budget, regular
from vault.errors import BadInput
from vault.text import clip, printable
from vault.resources import CATALOG as DEFAULT_CATALOG
from vault.yaml_bounds import Unbounded, expanded_weight


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
_SAFE_TEXT = re.compile(r"[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*")
MAX_TEXT = 4096  # characters of any string parameter
HIDDEN = "[hidden]"  # what an approver is shown for a parameter not marked safe to show
SUMMARY_CHARS = 80  # characters of a parameter an approver is shown (vault.text.clip)


class ParamSpec(BaseModel):
    """One parameter an agent gives. `pattern`, `enum` and `maxLength` use JSON Schema's
    names (`json_schema()` renders them as such); `pattern` must match the whole value."""

    model_config = _Strict
    type: Literal["string", "integer", "boolean"] = "string"
    required: bool = True
    # secret-looking values are never echoed into prompts or logs
    summary: bool = True
    # a regex the whole value must match (Python syntax)
    pattern: str | None = None
    # the only values allowed, of the parameter's type
    enum: tuple[StrictStr | StrictInt | StrictBool, ...] | None = None
    max_length: int | None = Field(default=None, alias="maxLength", ge=1, le=MAX_TEXT)

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                _compiled(value)
            except re.error as exc:
                raise ValueError(f"invalid regular expression ({exc.msg}"
                                 f"{f' at position {exc.pos}' if exc.pos is not None else ''})") from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "ParamSpec":
        if self.type != "string" and (self.pattern is not None or self.max_length is not None):
            raise ValueError("pattern and maxLength apply to string parameters only")
        if self.enum is not None:
            if not self.enum:
                raise ValueError("enum must list at least one value")
            for value in self.enum:
                if not _has_type(value, self.type):
                    raise ValueError(f"enum value {value!r} is not a {self.type}")
        return self

    def problem(self, value: Any) -> str | None:
        """Why `value` does not fit this declaration (type, length, pattern, enum), or None."""
        if not _has_type(value, self.type):
            return f"must be {self.type}"
        if self.type == "string":
            if len(value) > MAX_TEXT or not _SAFE_TEXT.fullmatch(value):
                return "has characters or length not allowed"
            if self.max_length is not None and len(value) > self.max_length:
                return f"is longer than {self.max_length} characters"
            if self.pattern is not None:
                matched = pattern_budget.fullmatch(_compiled(self.pattern), value)
                if matched is None:
                    return (f"could not be checked against {self.pattern} within "
                            f"{pattern_budget.BUDGET_S:g} s (the pattern backtracks on it)")
                if not matched:
                    return f"does not match {self.pattern}"
        # the type is checked above and every enum value has it, so True never equals 1 here
        if self.enum is not None and value not in self.enum:
            return "is not one of " + ", ".join(json.dumps(e) for e in self.enum)
        return None

    def json_schema(self) -> dict[str, Any]:
        """This declaration as a JSON Schema (e.g. for an MCP tool's input schema)."""
        out: dict[str, Any] = {"type": self.type}
        if self.pattern is not None:
            out["pattern"] = f"^(?:{self.pattern})$"  # JSON Schema patterns search; ours match whole
        if self.max_length is not None:
            out["maxLength"] = self.max_length
        if self.enum is not None:
            out["enum"] = list(self.enum)
        return out


_PY_TYPES = {"string": str, "integer": int, "boolean": bool}
_ABSENT = object()


def _has_type(value: Any, kind: str) -> bool:
    want = _PY_TYPES[kind]
    return isinstance(value, want) and not (want is int and isinstance(value, bool))


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


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
        why = self._declaration_problem(params)
        if why is not None:
            raise BadInput(why)
        return dict(params)

    def refused_values(self, params: Any) -> list[str]:
        """The declared parameters whose values the spec refuses (names, in order)."""
        if not isinstance(params, dict):
            return []
        return [name for name, spec in self.params.items()
                if name in params and spec.problem(params[name]) is not None]

    def refusal(self, params: dict[str, Any]) -> str | None:
        """Why this call must not be sent, naming the parameter, or None.

        What executors ask before anything leaves the vault: the declarations
        (as validate_params), then where each value goes (vault.param_safety): a
        path segment, a query value or an SSH command argument must not reach
        anything the catalog did not name."""
        why = self._declaration_problem(params)
        if why is not None:
            return why
        for name, where in self.positions.items():
            value = params.get(name, _ABSENT)
            if value is not _ABSENT:
                why = param_safety.problem(where, value)
                if why is not None:
                    return f"{self.name}: parameter {name!r} {why}"
        return None

    def _declaration_problem(self, params: Any) -> str | None:
        # on every call (twice: at the socket and before the gate), so no exceptions, no copies
        if not isinstance(params, dict):
            return "params must be an object"
        specs = self.params
        if not params.keys() <= specs.keys():
            unknown = sorted(set(params) - set(specs))
            return f"{self.name}: unknown parameter {unknown[0]!r}"
        for name, spec in specs.items():
            value = params.get(name, _ABSENT)
            if value is _ABSENT:
                if spec.required:
                    return f"{self.name}: missing parameter {name!r}"
                continue
            why = spec.problem(value)
            if why is not None:
                return f"{self.name}: parameter {name!r} {why}"
        return None

    @functools.cached_property
    def positions(self) -> dict[str, str]:
        """Where each declared parameter goes: "path", "query", "body" or "command"."""
        if self.executor == "ssh":
            used = set(_fields(self.command or ""))
            return {n: "command" for n in self.params if n in used}
        in_path = set(_fields(self.path or ""))
        rest = "body" if self.method in ("POST", "PUT", "PATCH") else "query"
        return {n: "path" if n in in_path else rest for n in self.params}

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
                out[name] = HIDDEN
            else:
                text = str(value)  # a long one keeps both ends and says how much is left out
                out[name] = value if len(text) <= SUMMARY_CHARS else clip(text, SUMMARY_CHARS)
        return out




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
ModelT = TypeVar("ModelT", bound=BaseModel)


MAX_YAML_BYTES = 16 << 20


def read_regular_text(path: Path, limit: int = MAX_YAML_BYTES, what: str = "a YAML file") -> str:
    """A regular file's text. A FIFO was waited on forever (and /dev/zero read without end): the
    daemon never started and never said why; such a file is refused, as is one past `limit`.
    OSError and UnicodeDecodeError are the caller's to word."""
    try:
        f = regular.open_file(path)
    except regular.NotRegular as exc:
        kind = "a directory" if exc.is_dir else "a FIFO, device or socket"
        raise BadInput(f"{path}: not a regular file ({kind}); give {what}") from None
    with f:
        st = os.fstat(f.fileno())
        if st.st_size > limit:
            raise BadInput(f"{path}: larger than {limit >> 20} MiB; not read")
        return f.read(limit + 1).decode("utf-8")


def _yaml_error_where(exc: yaml.YAMLError) -> str:
    """` line L, column C:` of the parser's mark, as an editor counts them (from 1)."""
    mark = getattr(exc, "problem_mark", None)
    return f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""


def _yaml_error_why(exc: yaml.YAMLError) -> str:
    """The parser's reason ("expected ',' or ']', but got '<block mapping start>'"), escaped
    and cut: it can quote the file (a tag, an alias), which is shown, never run on a terminal."""
    problem = getattr(exc, "problem", None)
    return f": {printable(str(problem), 200)}" if problem else ""


def load_yaml_file(path: str | Path) -> Any:
    """The YAML value of a regular file, bounded (vault.yaml_bounds); errors name the file and why."""
    path = Path(path)
    try:
        raw = yaml.load(read_regular_text(path), Loader=_YAML_LOADER)
        expanded_weight(raw)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise BadInput(f"{path}:{_yaml_error_where(exc)} not valid YAML{_yaml_error_why(exc)}") from None
    except Unbounded as exc:
        raise BadInput(f"{path}: not read: {exc}") from None
    except (ValueError, RecursionError):  # e.g. an integer longer than Python converts, or nesting too deep
        raise BadInput(f"{path}: holds a value too large or too deeply nested to read") from None
    return raw


def load_yaml_model(path: str | Path, model: type[ModelT]) -> ModelT:
    """Load YAML into a pydantic model; errors name the file, the field and why."""
    raw = load_yaml_file(path)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise BadInput(f"{path}: {format_validation_error(exc)}") from None


# A field's name comes from the file: a 15 MiB key made a 15 MiB error line, a key holding
# terminal escapes rewrote the terminal that printed it; and a file of 100,000 bad keys as many
# errors. Each name is shown escaped and cut, and only the first errors are listed.
_LOC_PART_CHARS = 80
_ERRORS_SHOWN = 20


def format_validation_error(exc: ValidationError) -> str:
    errors = exc.errors(include_input=False, include_url=False)
    parts = []
    for err in errors[:_ERRORS_SHOWN]:
        loc = ".".join(printable(str(p), _LOC_PART_CHARS) for p in err["loc"]) or "(top level)"
        parts.append(f"field {loc}: {printable(err['msg'], 4 * _LOC_PART_CHARS)}")
    if len(errors) > _ERRORS_SHOWN:
        parts.append(f"and {len(errors) - _ERRORS_SHOWN} more")
    return "; ".join(parts)


def load_catalog(path: str | Path | None = None) -> Catalog:
    return load_yaml_model(path or DEFAULT_CATALOG, Catalog)
