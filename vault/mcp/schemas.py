"""Catalog operations as MCP tools, and vault Results as MCP tool results.

One tool per catalog operation, named after it, so a host lists what the vault
can do instead of guessing a free-form operation string. Everything a tool
says comes from the daemon's `catalog` answer (the daemon's catalog and
policy, not a file the bridge happens to read):

    input schema    each parameter's type, required, and whatever constraints the
                    catalog has (pattern, enum, max length); plus the two vault
                    arguments `idempotency_key` and `wait_s`
    description     the operation's own text, its risk class, and its approval mode
                    in plain words (who is asked, when, what a grant covers)
    annotations     readOnly / destructive / idempotent hints from risk and catalog
    output schema   the Result model (structured content of every answer)

An operation is left out, with the reason on stderr and in vault://catalog,
when its name cannot be an MCP tool name or it declares a parameter named like
a vault argument.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mcp_types import CallToolResult, TextContent, Tool, ToolAnnotations
from pydantic import BaseModel, ConfigDict, ValidationError

from vault.catalog import DESTRUCTIVE, MAX_TEXT, ParamSpec
from vault.models import Result, result_schema

RESUME_TOOL = "vault_resume"
LOOKUP_TOOL = "vault_lookup"
GENERIC_TOOLS = (RESUME_TOOL, LOOKUP_TOOL)
# tool arguments that belong to the vault, not to the operation
VAULT_ARGS = ("idempotency_key", "wait_s")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")  # MCP tool names (SEP-986)
# Python-only regex syntax that a JSON Schema (ECMA-262) validator would read differently
_PY_ONLY_REGEX = re.compile(r"\(\?P|\(\?[aiLmsux]|\\[AZ]|\(\?#")
_DESTRUCTIVE = {str(r) for r in DESTRUCTIVE}
# a declaration's keys as the catalog file (and the daemon's `catalog` answer) spell them
_SPEC_FIELDS = {f.alias or n for n, f in ParamSpec.model_fields.items()}
_Wire = ConfigDict(frozen=True, extra="ignore")  # the daemon may add fields; older bridges ignore them


class ApprovalRule(BaseModel):
    model_config = _Wire
    mode: str
    deadline_s: float = 120.0
    owner: str | None = None
    ttl_s: float | None = None


class OperationView(BaseModel):
    """One operation as the daemon's `catalog` method describes it."""

    model_config = _Wire
    name: str
    description: str = ""
    risk: str
    params: dict[str, dict[str, Any]] = {}
    target: str = ""
    idempotent: bool = False
    mutates: bool = False
    approval: ApprovalRule


class CatalogView(BaseModel):
    model_config = _Wire
    fingerprint: str
    operations: list[OperationView]

    def get(self, name: str) -> OperationView | None:
        return next((op for op in self.operations if op.name == name), None)


def unpublishable(op: OperationView) -> str | None:
    """Why this operation cannot be offered as a tool, or None."""
    if not _TOOL_NAME.fullmatch(op.name):
        return "its name is not a valid MCP tool name (letters, digits, _ . - only, at most 128)"
    if op.name in GENERIC_TOOLS:
        return f"its name clashes with the bridge's own {op.name} tool"
    clash = sorted(set(op.params) & set(VAULT_ARGS))
    if clash:
        return f"its parameter {clash[0]!r} clashes with the vault argument of that name"
    return None


def scope_words(op: OperationView) -> str:
    """What a session grant for this operation covers, e.g. "delete_release on release <release_id>"."""
    target = re.sub(r"\{(\w+)\}", r"<\1>", op.target) if op.target else "its service"
    return f"{op.name} on {target}"


def approval_words(op: OperationView, budget_s: float) -> str:
    rule = op.approval
    who = f"approver {rule.owner!r}" if rule.owner else "a person"
    if rule.mode == "auto":
        return "Approval: none; it runs without asking anyone."
    if rule.mode == "deny":
        return "Approval: the policy denies it; every call returns authorization_denied and nothing is sent."
    if rule.mode == "session":
        how = (f"Approval: the first call asks {who}; if they allow it for the session, later calls on "
               f"{scope_words(op)} run without asking until this MCP session ends.")
    else:
        how = f"Approval: every call asks {who} (a grant for the session is never offered)."
    return (how + f" They have {rule.deadline_s:g}s to decide. This call waits at most {budget_s:g}s; "
            f"if still undecided it returns approval_pending with a resume_token: call {RESUME_TOOL} "
            "with it, do not call the operation again.")


def param_schema(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One parameter's JSON Schema: the catalog declaration's own (`ParamSpec.json_schema`),
    plus a length cap on every string and words for the model to read. A pattern in Python-only
    regex syntax, which an ECMA-262 validator would read differently, is left to the daemon."""
    try:
        decl = ParamSpec.model_validate({k: v for k, v in spec.items() if k in _SPEC_FIELDS})
    except ValidationError:  # a daemon a version ahead: its type at least, the daemon checks the rest
        kind = spec.get("type")
        decl = ParamSpec(type=kind if kind in ("integer", "boolean") else "string")
    out = decl.json_schema()
    words = [f"{name} ({decl.type})"]
    if decl.type == "string":
        out.setdefault("maxLength", MAX_TEXT)  # the daemon refuses longer strings anyway
        if decl.pattern is not None:
            if _PY_ONLY_REGEX.search(decl.pattern):
                del out["pattern"]
            words.append(f"must match {decl.pattern} in full")
    out["description"] = "; ".join(words)
    return out


def vault_args(op: OperationView | None, budget_s: float) -> dict[str, dict[str, Any]]:
    if op is None or op.idempotent:
        dedup = "the remote applies one logical operation once per key"
    else:
        dedup = ("this operation's remote ignores the key: a resend can apply twice, so after "
                 f"outcome_unknown call {LOOKUP_TOOL} before any retry")
    return {
        "idempotency_key": {
            "type": "string", "minLength": 1, "maxLength": 200,
            "description": ("Optional. A key you choose for this logical operation; send the same key when "
                            f"you retry it and give it to {LOOKUP_TOOL} to ask whether it took effect ({dedup})."),
        },
        "wait_s": {
            "type": "number", "minimum": 0, "maximum": budget_s,
            "description": (f"Optional. Seconds to wait in this call for a person's approval (at most "
                            f"{budget_s:g}, the default). 0 returns approval_pending at once if a person "
                            f"must decide; collect the outcome later with {RESUME_TOOL}."),
        },
    }


def operation_tool(op: OperationView, budget_s: float) -> Tool:
    props = {name: param_schema(name, spec) for name, spec in op.params.items()}
    props.update(vault_args(op, budget_s))
    required = [name for name, spec in op.params.items() if spec.get("required", True)]
    text = (op.description or op.name).rstrip(".") + "."
    risk = f" Risk: {op.risk}" + (" (changes remote state)." if op.mutates else ".")
    return Tool(
        name=op.name,
        description=f"{text}{risk} {approval_words(op, budget_s)} Answers with a vault Result: follow "
                    "its `retry` field (vault://catalog says what each value obliges you to do).",
        input_schema={"type": "object", "properties": props, "required": required,
                      "additionalProperties": False},
        output_schema=RESULT_SCHEMA,
        annotations=ToolAnnotations(
            title=op.name.replace("_", " "),
            read_only_hint=op.risk == "read" and not op.mutates,
            destructive_hint=op.risk in _DESTRUCTIVE,
            idempotent_hint=op.idempotent or not op.mutates,
            open_world_hint=True),
    )


def generic_tools(view: CatalogView | None, budget_s: float) -> list[Tool]:
    names = [op.name for op in view.operations] if view else []
    operation: dict[str, Any] = {"type": "string", "description": "The operation to look up (needed when "
                                 "the vault no longer remembers the correlation id)."}
    if names:
        operation["enum"] = names
    return [
        Tool(name=RESUME_TOOL,
             description=("Collect the outcome of a call that answered approval_pending: give its "
                          f"resume_token. Waits up to {budget_s:g}s for the person's decision; returns the "
                          "operation's Result once decided (it runs at most once), or approval_pending again."),
             input_schema={"type": "object", "properties": {
                 "resume_token": {"type": "string", "minLength": 1, "maxLength": 200,
                                  "description": "The resume_token of the approval_pending Result."},
                 "wait_s": vault_args(None, budget_s)["wait_s"]},
                 "required": ["resume_token"], "additionalProperties": False},
             output_schema=RESULT_SCHEMA,
             annotations=ToolAnnotations(title="vault resume", read_only_hint=False, destructive_hint=False,
                                         idempotent_hint=True, open_world_hint=True)),
        Tool(name=LOOKUP_TOOL,
             description=("Ask whether an earlier operation took effect, by its correlation_id or your "
                          "idempotency_key (required before retrying after outcome_unknown). The Result's "
                          "`reconciled` is found, not_found or unknown; retry only on not_found."),
             input_schema={"type": "object", "properties": {
                 "correlation_id": {"type": "string", "maxLength": 200,
                                    "description": "The correlation_id of the earlier Result."},
                 "idempotency_key": {"type": "string", "maxLength": 200,
                                     "description": "The idempotency_key you sent with the earlier call."},
                 "operation": operation},
                 "additionalProperties": False},
             output_schema=RESULT_SCHEMA,
             annotations=ToolAnnotations(title="vault lookup", read_only_hint=True, destructive_hint=False,
                                         idempotent_hint=True, open_world_hint=True)),
    ]


def build_tools(view: CatalogView | None, budget_s: float) -> tuple[list[Tool], list[tuple[str, str]]]:
    """(tools, [(operation, why it was left out)]). With no catalog yet, only the generic tools."""
    tools, skipped = [], []
    for op in view.operations if view else []:
        why = unpublishable(op)
        if why:
            skipped.append((op.name, why))
        else:
            tools.append(operation_tool(op, budget_s))
    return tools + generic_tools(view, budget_s), skipped


class ArgumentError(ValueError):
    """Tool arguments the bridge can tell are wrong before asking the daemon."""


def split_arguments(arguments: dict[str, Any] | None) -> tuple[dict[str, Any], str | None, float | None]:
    """(operation params, idempotency_key, wait_s) from one tool call's arguments."""
    args = dict(arguments or {})
    idem = args.pop("idempotency_key", None)
    wait = args.pop("wait_s", None)
    if idem is not None and not (isinstance(idem, str) and 0 < len(idem) <= 200):
        raise ArgumentError("idempotency_key must be a string of 1 to 200 characters")
    if wait is not None and (isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait >= 0):
        raise ArgumentError("wait_s must be a number of seconds, 0 or more")
    if wait is None:
        return args, idem, None
    try:
        return args, idem, float(wait)
    except OverflowError:  # an integer past a float's range: the longest wait, as 1e300 is (the budget caps it)
        return args, idem, float("inf")


def tool_result(result: Result) -> CallToolResult:
    """The Result as text and as structured content; isError unless it succeeded, so a host
    never mistakes a refusal or a pending approval for output."""
    data = result.model_dump(mode="json", exclude_none=True)
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(data))],
                          structured_content=data, is_error=not result.ok)


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """The Result schema with its $defs inlined: some hosts resolve no $ref in a tool's schema."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(defs[ref.split("/")[-1]])
            return {k: walk(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    inlined: dict[str, Any] = walk(schema)  # walk maps a dict to a dict
    return inlined


RESULT_SCHEMA: dict[str, Any] = _inline_refs(result_schema())
