"""The resource schemas: the API contract shared by the SDK, the CLI and the server.

Every resource is ``{apiVersion: nodus.dev/v1, kind, metadata, spec, status}``. Specs are
strict (an unknown field is refused with its path) because a silently ignored field is a
setting the user believes in and does not get. ``status`` is owned by the server: it is
accepted on input (so ``get -o yaml | apply -f -`` round-trips) and then ignored.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from .egress_policy import MAX_ALLOWED_HOSTS, validate_allowed_host
from .errors import Invalid, PayloadTooLarge

__all__ = [
    "API_VERSION",
    "FAMILIES",
    "MAX_INPUT_BYTES",
    "ANSWER_PREVIEW_BYTES",
    "RunPhase",
    "TERMINAL_PHASES",
    "at_cost_cap",
    "awaiting_message",
    "ObjectMeta",
    "ModelSpec",
    "SecretKeyRef",
    "EnvVarSource",
    "EnvVar",
    "NetworkSpec",
    "RESERVED_ENV",
    "AgentSpec",
    "AgentStatus",
    "Agent",
    "AgentRunSpec",
    "Turn",
    "AnswerStatus",
    "CostStatus",
    "SandboxStatus",
    "AgentRunStatus",
    "AgentRun",
    "AgentRunList",
    "member_run_name",
    "parse_run_list",
    "GroupPhase",
    "GROUP_TERMINAL_PHASES",
    "MAX_BATCH_RUNS",
    "GroupLimitsSpec",
    "EvaluationSpec",
    "MAX_EVALUATION_CASES",
    "AgentGroupSpec",
    "GroupCounts",
    "GroupCost",
    "EvaluationStatus",
    "CASE_STATES",
    "UNSCORED_STATES",
    "AgentGroupStatus",
    "AgentGroup",
    "Secret",
    "SecretStatus",
    "ROLES",
    "Role",
    "TokenSpec",
    "TokenStatus",
    "Token",
    "Resource",
    "KINDS",
    "SHORT_NAMES",
    "parse_resource",
    "parse_duration",
    "validate_dns_label",
]

API_VERSION = "nodus.dev/v1"
FAMILIES: tuple[str, ...] = ("haiku", "sonnet", "opus", "fable")
MAX_INPUT_BYTES = 256 * 1024
ANSWER_PREVIEW_BYTES = 4 * 1024

RunPhase = Literal["Pending", "Running", "Waiting", "Succeeded", "Failed", "Cancelled"]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed", "Cancelled"})
GroupPhase = Literal["Running", "Cancelling", "Succeeded", "Failed", "Cancelled"]
GROUP_TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed", "Cancelled"})
MAX_BATCH_RUNS = 100
MAX_PENDING_LIMIT = 10000
MAX_DEPENDS_ON = 100


def awaiting_message(status: dict[str, Any]) -> bool:
    """A keep-alive run that answered its turn and waits for the next message: its turn is done."""
    return status.get("phase") == "Waiting" and status.get("reason") == "AwaitingMessage"


def at_cost_cap(status: dict[str, Any]) -> bool:
    """A run parked at its cost cap: only a cancel or its deadline can end it, so waiters stop."""
    return status.get("phase") == "Waiting" and status.get("reason") == "MaxCostReached"


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DECIMAL = re.compile(r"^\d{1,7}(\.\d{1,6})?$")
_DURATION = re.compile(r"^(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?$", re.ASCII)
_MAX_DEADLINE = timedelta(days=30)


def validate_dns_label(value: str) -> str:
    """A name as Kubernetes spells one: lower-case letters, digits and '-', at most 63."""
    if not isinstance(value, str) or not _DNS_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a DNS label (lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters)"
        )
    return value


def _validate_usd(value: str) -> str:
    if not isinstance(value, str) or not _DECIMAL.match(value):
        raise ValueError(f'{value!r} is not a decimal amount of dollars such as "0.50"')
    try:
        amount = Decimal(value)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid decimals
        raise ValueError(f"{value!r} is not a decimal") from exc
    if amount <= 0:
        raise ValueError("must be more than 0")
    return value


def parse_duration(value: str) -> timedelta:
    """``"2h"``, ``"30m"``, ``"90s"`` or ``"1h30m"``; the units of the product documents."""
    match = _DURATION.match(value) if isinstance(value, str) else None
    if not value or not match or not any(match.groups()):
        raise ValueError(f'{value!r} is not a duration such as "30m", "2h" or "1h30m"')
    hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    try:
        return timedelta(hours=hours, minutes=minutes, seconds=seconds)
    except OverflowError:  # "99999999999999999999h": a refusal, not a crash
        raise ValueError(f"{value!r} is longer than any duration nodus takes") from None


def _validate_deadline(value: str) -> str:
    duration = parse_duration(value)
    if duration <= timedelta(0) or duration > _MAX_DEADLINE:
        raise ValueError("must be more than 0s and at most 720h")
    return value


def _validate_input(value: str) -> str:
    if len(value.encode("utf-8")) > MAX_INPUT_BYTES:
        raise ValueError(f"is larger than {MAX_INPUT_BYTES} bytes (256 KiB)")
    return value


DnsLabel = Annotated[str, AfterValidator(validate_dns_label)]
UsdAmount = Annotated[str, AfterValidator(_validate_usd)]
Duration = Annotated[str, AfterValidator(_validate_deadline)]
Family = Literal["haiku", "sonnet", "opus", "fable"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=False)


class _Open(BaseModel):
    """Server-written parts (status) stay readable by older clients when fields are added."""

    model_config = ConfigDict(extra="allow")


class ObjectMeta(_Strict):
    name: DnsLabel
    project: str | None = None
    uid: str | None = None
    generation: int | None = None
    resourceVersion: int | None = None  # the server's count of writes (a run's, for resolve)
    creationTimestamp: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class ModelSpec(_Strict):
    """Which Claude the agent runs on: the server's (``Nodus``) or the user's key (``BYOK``)."""

    access: Literal["Nodus", "BYOK"] = "Nodus"
    families: list[Family] | None = Field(default=None, min_length=1)
    name: str | None = Field(default=None, min_length=1, max_length=128)
    apiKeySecret: DnsLabel | None = None


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Set by the sandbox itself: an Agent cannot move the workspace or route around the egress proxy.
RESERVED_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "LANG",
        "TERM",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
    }
)
MAX_ENV_VARS = 64


def _validate_env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(
            f"{value[:40]!r} is not an environment variable name (letters, digits and _, not first a digit)"
        )
    if value in RESERVED_ENV:
        raise ValueError(f"{value} is set by the sandbox itself and cannot be set by an Agent")
    return value


class SecretKeyRef(_Strict):
    name: DnsLabel  # a Secret of the Agent's project
    key: str = Field(min_length=1, max_length=128)


class EnvVarSource(_Strict):
    secretKeyRef: SecretKeyRef


class EnvVar(_Strict):
    """One variable of the run's commands: a plain ``value``, or a Secret's key (redacted from
    everything the run records)."""

    name: Annotated[str, AfterValidator(_validate_env_name)]
    value: str | None = Field(default=None, max_length=32 * 1024)
    valueFrom: EnvVarSource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if (self.value is None) == (self.valueFrom is None):
            raise ValueError("set exactly one of value and valueFrom")
        return self


class NetworkSpec(_Strict):
    """What a run's commands may reach: nothing unless listed (through the egress proxy)."""

    allowedHosts: list[Annotated[str, AfterValidator(validate_allowed_host)]] = Field(
        default_factory=list, max_length=MAX_ALLOWED_HOSTS
    )


def _unique_env(values: list[EnvVar]) -> list[EnvVar]:
    seen: set[str] = set()
    for index, variable in enumerate(values):
        if variable.name in seen:
            raise ValueError(f"[{index}]: {variable.name} is set twice")
        seen.add(variable.name)
    return values


class AgentSpec(_Strict):
    system: str = Field(default="", max_length=MAX_INPUT_BYTES)
    model: ModelSpec = Field(default_factory=ModelSpec)
    maxTokens: int = Field(default=1024, ge=1, le=128_000)
    maxToolCalls: int = Field(default=50, ge=1, le=1000)
    perRunMaxCostUSD: UsdAmount = "1.00"
    image: str | None = Field(default=None, max_length=512)
    state: Literal["Running", "Stopped"] = "Running"
    env: Annotated[list[EnvVar], AfterValidator(_unique_env)] = Field(
        default_factory=list, max_length=MAX_ENV_VARS
    )
    network: NetworkSpec | None = None


class AgentStatus(_Open):
    revision: int = 0
    updatedAt: str | None = None


class Agent(_Strict):
    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["Agent"] = "Agent"
    metadata: ObjectMeta
    spec: AgentSpec = Field(default_factory=AgentSpec)
    status: AgentStatus | None = None


class AgentRunSpec(_Strict):
    agent: DnsLabel
    input: Annotated[str, AfterValidator(_validate_input)] = ""
    deadline: Duration | None = None
    keepAlive: bool = False
    # Group membership: the run is task ``taskKey`` of AgentGroup ``group`` and is named
    # ``<group>-<taskKey>``; it starts only once every task in ``dependsOn`` has succeeded.
    group: DnsLabel | None = None
    taskKey: DnsLabel | None = None
    dependsOn: list[DnsLabel] | None = Field(default=None, max_length=MAX_DEPENDS_ON)


class Turn(_Open):
    """One prompt of the conversation: who served it, how it was chosen, what it cost."""

    index: int
    prompt: str = ""
    family: str | None = None
    model: str | None = None
    routing: Literal["jev", "fallback", "pinned"] | None = None
    inputTokens: int = 0
    outputTokens: int = 0
    cacheCreationTokens: int = 0
    cacheReadTokens: int = 0
    toolCalls: int = 0
    costUSD: str = "0"
    stopReason: str | None = None
    startedAt: str | None = None
    finishedAt: str | None = None


class AnswerStatus(_Open):
    preview: str = ""
    bytes: int = 0
    truncated: bool = False


class CostStatus(_Open):
    totalUSD: str = "0"
    limitUSD: str | None = None


class SandboxStatus(_Open):
    """Which isolation the run got; ``process`` means bubblewrap could not run here."""

    backend: Literal["bubblewrap", "process"] | None = None
    node: str | None = None  # the host name
    nodeId: str | None = None  # the Ray node the run's current actor is on
    workspace: str | None = None
    # Where the actor got the workspace: "local" (this node's disk) or "restored" (the
    # snapshot in storage, because the run moved to a node that did not have it).
    origin: Literal["local", "restored"] | None = None
    uid: int | None = None
    note: str | None = None


class AgentRunStatus(_Open):
    phase: RunPhase = "Pending"
    reason: str | None = None
    message: str | None = None
    agentRevision: int | None = None
    createdAt: str | None = None
    startedAt: str | None = None
    finishedAt: str | None = None
    attempts: int = 0
    sandbox: SandboxStatus = Field(default_factory=SandboxStatus)
    turns: list[Turn] = Field(default_factory=list)
    answer: AnswerStatus | None = None
    cost: CostStatus = Field(default_factory=CostStatus)


class AgentRun(_Strict):
    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["AgentRun"] = "AgentRun"
    metadata: ObjectMeta
    spec: AgentRunSpec
    status: AgentRunStatus | None = None


def member_run_name(group: str, task_key: str) -> str:
    """The name of task ``task_key`` of ``group``: ``<group>-<taskKey>``."""
    return f"{group}-{task_key}"


class AgentRunList(_Strict):
    """A batch of runs created together (``POST .../agentruns``): all or none, in list order."""

    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["AgentRunList"] = "AgentRunList"
    items: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_BATCH_RUNS)


# -- AgentGroup ----------------------------------------------------------------------------------


class GroupLimitsSpec(_Strict):
    maxActive: int = Field(default=10, ge=1, le=1000)
    maxPending: int = Field(default=10000, ge=1, le=MAX_PENDING_LIMIT)


MAX_EVALUATION_CASES = 100
_ENVIRONMENT_REF = re.compile(
    r"^(?P<owner>[a-z0-9]([-a-z0-9]*[a-z0-9])?)/(?P<name>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)"
    r"(@(?P<version>[0-9A-Za-z][0-9A-Za-z.+-]*))?$"
)
_EVALUATION_TIMEOUT = (timedelta(minutes=1), timedelta(hours=24))


def _validate_environment_ref(value: str) -> str:
    match = _ENVIRONMENT_REF.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f'{value[:80]!r} is not an Environment reference such as "nodus/arithmetic-v2@2.0.0" '
            "(owner/name@version)"
        )
    if match.group("version") is None:
        raise ValueError(
            f'{value!r} names no version; an evaluation pins one, e.g. "{value}@2.0.0" '
            "(`nodus get environments` lists the versions)"
        )
    return value


def _validate_evaluation_timeout(value: str) -> str:
    duration = parse_duration(value)
    low, high = _EVALUATION_TIMEOUT
    if duration < low or duration > high:
        raise ValueError(f"{value!r} is outside 1m to 24h")
    return value


class EvaluationSpec(_Strict):
    """A versioned Environment's fixed task batch, run by the group and graded (document 002).

    ``timeout`` counts from the group's creation and covers queueing and funding waits: it is
    every member's absolute deadline, and grading stops at it too.
    """

    environment: Annotated[str, AfterValidator(_validate_environment_ref)]
    split: str = Field(default="test", min_length=1, max_length=63)
    tasks: int = Field(ge=1, le=MAX_EVALUATION_CASES)
    repetitions: int = Field(default=1, ge=1, le=MAX_EVALUATION_CASES)
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    timeout: Annotated[str, AfterValidator(_validate_evaluation_timeout)] = "30m"

    @model_validator(mode="after")
    def _bounded_batch(self) -> EvaluationSpec:
        if self.tasks * self.repetitions > MAX_EVALUATION_CASES:
            raise ValueError(
                f"tasks x repetitions is {self.tasks * self.repetitions}; an evaluation runs at most "
                f"{MAX_EVALUATION_CASES} cases"
            )
        return self


class AgentGroupSpec(_Strict):
    """Runs of one agent under one concurrency limit and one cost cap.

    ``sealed`` and ``state: Cancelled`` are one-way: once set they cannot be unset, and
    ``maxCostUSD`` can only grow; the control plane enforces both on every update.
    """

    agent: DnsLabel
    limits: GroupLimitsSpec = Field(default_factory=GroupLimitsSpec)
    maxCostUSD: UsdAmount | None = None
    sealed: bool = False
    state: Literal["Running", "Cancelled"] = "Running"
    evaluation: EvaluationSpec | None = None


class GroupCounts(_Open):
    queued: int = 0
    active: int = 0
    waiting: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    total: int = 0


class GroupCost(_Open):
    totalUSD: str = "0"
    limitUSD: str | None = None
    reservedUSD: str = "0"


# A case's evaluation state. Pending: its run has not finished; Grading: the grader has its
# answer; Scored: a verdict and a reward. The rest are unscored, each for its own reason, and
# left out of the pass rate and the mean reward (a failure is not a zero reward).
UNSCORED_STATES: tuple[str, ...] = (
    "RunFailed",
    "RunCancelled",
    "MissingAnswer",
    "GraderFailed",
    "EvaluationTimeout",
    "GradingCancelled",
)
CASE_STATES: tuple[str, ...] = ("Pending", "Grading", "Scored", *UNSCORED_STATES)


class EvaluationStatus(_Open):
    """What the evaluation found so far; rates are over scored cases only (None before the first)."""

    environment: str
    version: str
    imageDigest: str | None = None
    split: str
    seed: int
    tasks: int
    repetitions: int
    cases: int
    deadlineAt: str | None = None
    scored: int = 0
    unscored: int = 0
    pending: int = 0
    passed: int = 0
    passRate: float | None = None
    meanReward: float | None = None
    unscoredReasons: dict[str, int] = Field(default_factory=dict)
    grading: dict[str, Any] = Field(default_factory=dict)


class AgentGroupStatus(_Open):
    phase: GroupPhase = "Running"
    reason: str | None = None
    message: str | None = None
    counts: GroupCounts = Field(default_factory=GroupCounts)
    blockedReasons: dict[str, int] = Field(
        default_factory=lambda: {"DependencyWait": 0, "MaxActiveReached": 0, "MaxCostReached": 0}
    )
    cost: GroupCost = Field(default_factory=GroupCost)
    agentRevision: int | None = None
    finishedAt: str | None = None
    evaluation: EvaluationStatus | None = None


class AgentGroup(_Strict):
    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["AgentGroup"] = "AgentGroup"
    metadata: ObjectMeta
    spec: AgentGroupSpec
    status: AgentGroupStatus | None = None


_SECRET_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,252}$")
MAX_SECRET_VALUE_BYTES = 64 * 1024


def _validate_secret_values(values: dict[str, str] | None) -> dict[str, str] | None:
    # Messages name keys, never values: a refusal must not echo a secret back.
    for key, value in (values or {}).items():
        if not _SECRET_KEY.match(key):
            raise ValueError(f"key {key[:40]!r} must look like an environment variable name")
        if len(value.encode("utf-8")) > MAX_SECRET_VALUE_BYTES:
            raise ValueError(f"the value of {key} is larger than {MAX_SECRET_VALUE_BYTES} bytes")
    return values


def _validate_base64_values(values: dict[str, str] | None) -> dict[str, str] | None:
    import base64
    import binascii

    for key, value in (values or {}).items():
        try:
            base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise ValueError(f"the value of {key[:40]!r} is not base64 of UTF-8 text") from None
    return values


class SecretStatus(_Open):
    keys: list[str] = Field(default_factory=list)
    updatedAt: str | None = None


class Secret(_Strict):
    """Named values such as ``ANTHROPIC_API_KEY``: written with ``stringData`` (or base64
    ``data``), never read back; the API shows only their keys."""

    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["Secret"] = "Secret"
    metadata: ObjectMeta
    type: Literal["Opaque"] = "Opaque"
    stringData: Annotated[dict[str, str] | None, AfterValidator(_validate_secret_values)] = Field(
        default=None, repr=False
    )
    data: Annotated[
        dict[str, str] | None,
        AfterValidator(_validate_base64_values),
        AfterValidator(_validate_secret_values),
    ] = Field(default=None, repr=False)
    status: SecretStatus | None = None


# What a token may do in its project: ``read`` (every GET), ``write`` (read, and every change
# to agents, runs, groups and secrets), ``admin`` (write, and the project's tokens).
Role = Literal["read", "write", "admin"]
ROLES: tuple[str, ...] = ("read", "write", "admin")
_MAX_TOKEN_LIFETIME = timedelta(days=366)


def _validate_token_lifetime(value: str) -> str:
    duration = parse_duration(value)
    if duration < timedelta(minutes=1) or duration > _MAX_TOKEN_LIFETIME:
        raise ValueError("must be from 1m to 8784h (a year)")
    return value


class TokenSpec(_Strict):
    role: Role = "read"
    # How long the token is accepted after it is created; unset: until it is revoked.
    expiresIn: Annotated[str, AfterValidator(_validate_token_lifetime)] | None = None


class TokenStatus(_Open):
    # The token itself, in the answer to its creation only: the server keeps a hash.
    token: str | None = Field(default=None, repr=False)
    prefix: str | None = None  # the first characters, to tell tokens apart in a list
    createdAt: str | None = None
    expiresAt: str | None = None


class Token(_Strict):
    """An API bearer token of one project, with a role; created by POST, revoked by DELETE."""

    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["Token"] = "Token"
    metadata: ObjectMeta
    spec: TokenSpec = Field(default_factory=TokenSpec)
    status: TokenStatus | None = None


Resource = Agent | AgentRun | AgentGroup | Secret | Token

KINDS: dict[str, type[_Strict]] = {
    "Agent": Agent,
    "AgentRun": AgentRun,
    "AgentGroup": AgentGroup,
    "Secret": Secret,
    "Token": Token,
}

# kubectl-style names the CLI accepts, mapped to the kind and the REST collection.
SHORT_NAMES: dict[str, tuple[str, str]] = {
    "agent": ("Agent", "agents"),
    "agents": ("Agent", "agents"),
    "agentrun": ("AgentRun", "agentruns"),
    "agentruns": ("AgentRun", "agentruns"),
    "ar": ("AgentRun", "agentruns"),
    "agentgroup": ("AgentGroup", "agentgroups"),
    "agentgroups": ("AgentGroup", "agentgroups"),
    "ag": ("AgentGroup", "agentgroups"),
    "secret": ("Secret", "secrets"),
    "secrets": ("Secret", "secrets"),
    "token": ("Token", "tokens"),
    "tokens": ("Token", "tokens"),
    # Read-only: the Environments installed on the server (`nodus get environments`).
    "environment": ("Environment", "environments"),
    "environments": ("Environment", "environments"),
    "env": ("Environment", "environments"),
}


def _field_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("." if path else "") + str(part)
    return path


def parse_resource(document: Any, *, expected_kind: str | None = None) -> Resource:
    """Validate one decoded document into its resource model.

    Raises `Invalid` naming the offending field (``kind``, ``spec.model.families[0]``, ...), or
    `PayloadTooLarge` for an input over 256 KiB, so every entry point refuses the same way.
    """
    if not isinstance(document, dict):
        raise Invalid(
            "a resource must be a mapping with apiVersion, kind, metadata and spec", details={"field": ""}
        )
    api_version = document.get("apiVersion")
    if api_version != API_VERSION:
        raise Invalid(
            f"apiVersion {api_version!r} is not supported; use {API_VERSION!r}",
            details={"field": "apiVersion"},
        )
    kind = document.get("kind")
    model = KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise Invalid(
            f"kind {kind!r} is not known; known kinds: {', '.join(KINDS)}", details={"field": "kind"}
        )
    if expected_kind is not None and kind != expected_kind:
        raise Invalid(
            f"kind {kind!r} was sent where {expected_kind!r} is expected", details={"field": "kind"}
        )
    if kind == "AgentRun":
        document = _name_member(document)
    try:
        resource = model.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = _field_path(tuple(first["loc"]))
        message = first["msg"]
        if first["type"] == "extra_forbidden":
            message = "unknown field"
        message = message.removeprefix("Value error, ")
        cls = PayloadTooLarge if field == "spec.input" and "256 KiB" in message else Invalid
        more = len(exc.errors()) - 1
        suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise cls(f"{kind} {field}: {message}{suffix}", details={"field": field, "kind": kind}) from None
    if isinstance(resource, AgentRun):
        _check_membership(resource.spec)
    return resource  # type: ignore[return-value]


def _name_member(document: dict[str, Any]) -> dict[str, Any]:
    """A group member is named ``<group>-<taskKey>``: filled in when left out, refused when different."""
    spec = document.get("spec")
    if not isinstance(spec, dict):
        return document
    group, task_key = spec.get("group"), spec.get("taskKey")
    if not (isinstance(group, str) and isinstance(task_key, str)):
        return document
    for field, value in (("group", group), ("taskKey", task_key)):
        if not _DNS_LABEL.match(value):
            raise Invalid(
                f"AgentRun spec.{field}: {value[:70]!r} is not a DNS label (lower-case letters, digits "
                "and '-', starting and ending with a letter or digit, at most 63 characters)",
                details={"field": f"spec.{field}", "kind": "AgentRun"},
            )
    expected = member_run_name(group, task_key)
    metadata = document.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        return document
    name = metadata.get("name")
    if name is None:
        if len(expected) > 63:
            raise Invalid(
                f"AgentRun spec.taskKey: the run's name {expected[:70]!r}... (<group>-<taskKey>) is "
                "longer than 63 characters; use a shorter taskKey",
                details={"field": "spec.taskKey", "kind": "AgentRun"},
            )
        return {**document, "metadata": {**metadata, "name": expected}}
    if name != expected:
        raise Invalid(
            f"AgentRun metadata.name: a run of group {group!r} with taskKey {task_key!r} is named "
            f"{expected!r}; leave metadata.name out or set exactly that, not {name!r}",
            details={"field": "metadata.name", "kind": "AgentRun"},
        )
    return document


def _check_membership(spec: AgentRunSpec) -> None:
    """Group fields come together; refused here so every entry point names the same field."""

    def refuse(field: str, message: str) -> None:
        raise Invalid(
            f"AgentRun spec.{field}: {message}", details={"field": f"spec.{field}", "kind": "AgentRun"}
        )

    if spec.group is None:
        if spec.taskKey is not None:
            refuse("taskKey", "only a run in a group has a taskKey; set spec.group too")
        if spec.dependsOn:
            refuse("dependsOn", "only a run in a group has dependencies; set spec.group too")
        return
    if spec.taskKey is None:
        refuse("taskKey", "a run in a group needs a taskKey (a DNS label unique in the group)")
    if spec.keepAlive:
        refuse("keepAlive", "a run in a group cannot be keepAlive: a group finishes when its runs do")


def parse_run_list(document: Any) -> list[AgentRun]:
    """Validate an AgentRunList; a refusal names the item (``items[3].spec.taskKey``)."""
    if not isinstance(document, dict):
        raise Invalid(
            "an AgentRunList must be a mapping with apiVersion, kind and items", details={"field": ""}
        )
    try:
        batch = AgentRunList.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = _field_path(tuple(first["loc"]))
        message = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
        if field == "items" and first["type"] == "too_long":
            message = f"a batch holds at most {MAX_BATCH_RUNS} runs"
        raise Invalid(
            f"AgentRunList {field}: {message}", details={"field": field, "kind": "AgentRunList"}
        ) from None
    runs: list[AgentRun] = []
    for index, item in enumerate(batch.items):
        try:
            parsed = parse_resource(item, expected_kind="AgentRun")
        except Invalid as exc:
            field = f"items[{index}]" + (f".{exc.details['field']}" if exc.details.get("field") else "")
            raise type(exc)(
                f"items[{index}]: {exc.message}",
                code=exc.code,
                details={**exc.details, "field": field, "index": index},
            ) from None
        assert isinstance(parsed, AgentRun)
        runs.append(parsed)
    return runs
