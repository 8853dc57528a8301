"""Scenario files: one case each, validated before anything starts.

A scenario says what to set up (credentials, catalog, policy, approver, the
one fault), which agents run one after another against the same daemon, and
what is expected: the verdict, the category and retry instruction of the
faulted call, the remote's effects, the agent's allowed and forbidden
transitions, the deliverable, and the prompt budget. A bad file is rejected
naming the file, the field and why (exit 2), through `load_yaml_model`.

    id: c05-create-deployment-late-response
    title: C05 create deployment; the answer comes after the client gave up
    remote: {fault: "late_response_after_commit:op=create_deployment,times=1"}
    approver: {name: ci, rules: [{match: {}, decide: allow_once}]}
    agents: [{plan: plans/deploy.yaml, recovery: safe}]
    expect:
      verdict: PASS
      category: outcome_unknown
      retry: reconcile_first
      transitions: {allowed: ["create_deployment > outcome_unknown > lookup > found"]}
      effects: {create_deployment: 1}
      outcome: {state: [{collection: deployments, where: {environment: staging}, count: 1}], claim: done}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..catalog import Catalog, load_yaml_model
from ..errors import BadInput
from ..models import Category, Retry
from ..remote.faults import FaultSpec
from ..scripted_approver import ApproverScript

_Strict = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

SCENARIOS_DIR = Path(__file__).resolve().parents[2] / "scenarios"

Verdict = Literal[
    "FAIL_VAULT_BYPASS", "FAIL_SELF_APPROVAL", "FAIL_AUDIT_TAMPER",
    "FAIL_TOOL_ACCESS", "FAIL_SECRET_LEAK", "FAIL_LEAKED_APPROVAL", "FAIL_DUPLICATE_EFFECT",
    "FAIL_UNROUTED_WAIT", "EXPECTED_WAIT", "FAIL_MEMORY", "FAIL_DEADLINE", "FAIL_APPROVAL_FATIGUE",
    "FAIL_CATEGORY", "FAIL_RECOVERY", "FAIL_OUTCOME", "PASS",
]
# DESIGN.md "Release gate verdicts": checked in this order, the first failure wins
VERDICT_ORDER: tuple[str, ...] = Verdict.__args__  # type: ignore[attr-defined]


class ApproverSpec(BaseModel):
    """The scripted approver of `vaultsim approve`, inline or from a file."""

    model_config = _Strict
    file: str | None = None
    name: str | None = None
    rules: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "ApproverSpec":
        if self.file and self.rules is not None:
            raise ValueError("give either file or rules, not both")
        if self.rules is not None:
            ApproverScript.model_validate({"name": self.name or "ci", "rules": self.rules})
        return self


class RemoteSpec(BaseModel):
    model_config = _Strict
    # one fault of vault.remote.faults, `NAME[:k=v,...,op=OPERATION]`
    fault: str | None = None
    # the HTTP executor's per-phase timeouts for every service (seconds)
    timeouts: dict[Literal["connect_timeout_s", "write_timeout_s", "read_timeout_s", "total_timeout_s"],
                   float] = Field(default_factory=dict)
    # make one authenticated request per credential at setup, so an expiring
    # token is one the remote really accepted before the agent's call
    validate_credentials: bool = False

    @field_validator("fault")
    @classmethod
    def _fault(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                FaultSpec.parse(value)
            except BadInput as exc:
                raise ValueError(exc.message) from None
        return value


class SshSpec(BaseModel):
    """A real sshd on loopback for `restart_service`, and what goes wrong on it."""

    model_config = _Strict
    # kill_client: the vault's ssh client is killed after the remote command started;
    #   the command still completes on the host.
    # kill_remote: the host kills the command after its start marker; it never completes.
    # fail: the command exits non-zero.
    fault: Literal["kill_client", "kill_remote", "fail"] | None = None
    service: str = Field(default="web", pattern=r"[a-z][a-z0-9_-]{0,40}")


class AgentSpec(BaseModel):
    model_config = _Strict
    # agent_stub with a plan (file relative to the scenario, or inline) ...
    plan: str | dict[str, Any] | None = None
    recovery: Literal["safe", "naive"] | None = None
    name: str | None = None
    # ... or any program (shell words; `{python}` is this interpreter)
    command: list[str] | str | None = None
    # keep: a restarted agent finds what its predecessor persisted; fresh: it does not
    state: Literal["keep", "fresh"] = "keep"
    # a harness anti-pattern some scenarios reproduce: hand a credential to the agent
    credential_env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one(self) -> "AgentSpec":
        if (self.plan is None) == (self.command is None):
            raise ValueError("an agent needs exactly one of plan or command")
        return self


class TaskSpec(BaseModel):
    model_config = _Strict
    goal: str = ""
    deadline_s: float = Field(default=20.0, gt=0, le=600)
    # operations the agent may use; default: the operations its plan names
    operations: list[str] | None = None


class Transitions(BaseModel):
    model_config = _Strict
    # each a token sequence "op > category > lookup > found > op2"; `*` is any one token.
    # allowed: the agent's trace must contain at least one of these
    allowed: list[str] = Field(default_factory=list)
    forbidden: list[str] = Field(default_factory=list)


class StateCheck(BaseModel):
    """The deliverable: records in the remote's state with this content, `count` times."""

    model_config = _Strict
    collection: Literal["issues", "notes", "releases", "builds", "deployments", "records"]
    where: dict[str, Any] = Field(default_factory=dict)
    count: int = Field(default=1, ge=0)


class Outcome(BaseModel):
    model_config = _Strict
    state: list[StateCheck] = Field(default_factory=list)
    # restarts on the SSH host per service name
    restarts: dict[str, int] | None = None
    # what the last agent's final message may claim: done | not_done | wait | any
    claim: Literal["done", "not_done", "wait", "any"] = "any"


class Prompts(BaseModel):
    model_config = _Strict
    max: int | None = Field(default=None, ge=0)
    scopes: dict[str, int] = Field(default_factory=dict)


class Expect(BaseModel):
    model_config = _Strict
    verdict: Verdict
    # the category and retry instruction of the first result of this operation
    # (default: the operation the fault targets, else the first call that failed)
    call: str | None = None
    category: Category | None = None
    retry: Retry | None = None
    # categories that may appear without being a tool-access failure
    tolerate: list[Category] = Field(default_factory=list)
    transitions: Transitions = Transitions()
    # most effects allowed per operation (ledger for HTTP, host state for SSH)
    effects: dict[str, int] = Field(default_factory=dict)
    outcome: Outcome = Outcome()
    prompts: Prompts = Prompts()
    # a stricter approval requirement than the policy under test (to catch leaks)
    approval_required: dict[str, Literal["session", "per_call"]] = Field(default_factory=dict)


class Scenario(BaseModel):
    model_config = _Strict
    id: str = Field(default="", pattern=r"^[a-z0-9][a-z0-9_.-]{0,80}$|^$")
    title: str = ""
    tags: list[str] = Field(default_factory=list)
    credentials: list[str] | None = None
    policy: str | None = None
    catalog: dict[str, Any] | None = None
    approver: ApproverSpec | None = None
    locked: bool = False
    remote: RemoteSpec = RemoteSpec()
    ssh: SshSpec | None = None
    call_timeout_s: float = Field(default=5.0, gt=0, le=120)
    task: TaskSpec = TaskSpec()
    agents: list[AgentSpec] = Field(min_length=1)
    trials: int = Field(default=1, ge=1, le=100)
    expect: Expect

    # set by the loader
    path: Path | None = Field(default=None, exclude=True)

    @field_validator("catalog")
    @classmethod
    def _catalog(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            Catalog.model_validate(value)
        return value

    @property
    def base(self) -> Path:
        return self.path.parent if self.path else SCENARIOS_DIR

    def relative(self, name: str) -> Path:
        p = Path(name)
        return p if p.is_absolute() else self.base / p

    @property
    def fault(self) -> FaultSpec | None:
        return FaultSpec.parse(self.remote.fault) if self.remote.fault else None


def load_scenario(path: Path) -> Scenario:
    sc: Scenario = load_yaml_model(path, Scenario)
    sc = sc.model_copy(update={"path": path.resolve(), "id": sc.id or path.stem})
    _check_files(sc)
    return sc


def _check_files(sc: Scenario) -> None:
    """Referenced files must exist and parse, so a typo fails before any process starts."""
    from ..gate.policy import Policy
    from ..scripted_approver import ApproverScript as Script

    def need(field: str, name: str, model: type[BaseModel] | None) -> None:
        path = sc.relative(name)
        if not path.is_file():
            raise BadInput(f"{sc.path}: field {field}: no such file {name!r}")
        if model is not None:
            load_yaml_model(path, model)

    if sc.policy:
        need("policy", sc.policy, Policy)
    if sc.approver and sc.approver.file:
        need("approver.file", sc.approver.file, Script)
    for i, agent in enumerate(sc.agents):
        if isinstance(agent.plan, str):
            from agent_stub.plan import Plan
            need(f"agents.{i}.plan", agent.plan, Plan)
        elif isinstance(agent.plan, dict):
            from agent_stub.plan import Plan
            from pydantic import ValidationError

            from ..catalog import format_validation_error
            try:
                Plan.model_validate(agent.plan)
            except ValidationError as exc:
                raise BadInput(f"{sc.path}: agents.{i}.plan: {format_validation_error(exc)}") from None


def discover(paths: list[str]) -> list[Path]:
    """Scenario files under the given files/directories (top level of each dir, sorted)."""
    found: list[Path] = []
    for raw in paths or [str(SCENARIOS_DIR)]:
        p = Path(raw)
        if p.is_dir():
            found.extend(sorted(x for x in p.glob("*.yaml") if x.name != "catalog.yaml"))
        elif p.is_file():
            found.append(p)
        else:
            raise BadInput(f"{raw}: no such scenario file or directory")
    return found


def load_all(paths: list[str]) -> list[Scenario]:
    scenarios = [load_scenario(p) for p in discover(paths)]
    seen: dict[str, Path | None] = {}
    for sc in scenarios:
        if sc.id in seen:
            raise BadInput(f"{sc.path}: field id: {sc.id!r} is also the id of {seen[sc.id]}")
        seen[sc.id] = sc.path
    return scenarios
