"""The resource schemas: the API contract shared by the SDK, the CLI and the server.

Every resource is ``{apiVersion: nodus.dev/v1, kind, metadata, spec, status}``. Specs are
strict (an unknown field is refused with its path) because a silently ignored field is a
setting the user believes in and does not get. ``status`` is owned by the server: it is
accepted on input (so ``get -o yaml | apply -f -`` round-trips) and then ignored.

The models live by kind (`schema_common`, `schema_agent`, `schema_run`, `schema_group`,
`schema_access`); this module is where everyone imports them from, and where a decoded
document becomes one (`parse_resource`, `parse_run_list`), refused the same way at every entry.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from .durations import parse_duration
from .errors import Invalid, PayloadTooLarge
from .schema_access import ROLES, Role, Secret, SecretStatus, Token, TokenSpec, TokenStatus
from .schema_agent import (
    RESERVED_ENV,
    Agent,
    AgentSpec,
    AgentStatus,
    EnvVar,
    EnvVarSource,
    ModelSpec,
    NetworkSpec,
    SecretKeyRef,
)
from .schema_budget import Budget, BudgetSpec, BudgetStatus
from .schema_common import (
    ANSWER_PREVIEW_BYTES,
    API_VERSION,
    DNS_LABEL,
    FAMILIES,
    MAX_INPUT_BYTES,
    ObjectMeta,
    StrictModel,
    validate_dns_label,
)
from .schema_group import (
    CASE_STATES,
    GROUP_TERMINAL_PHASES,
    MAX_EVALUATION_CASES,
    UNSCORED_STATES,
    AgentGroup,
    AgentGroupSpec,
    AgentGroupStatus,
    EvaluationSpec,
    EvaluationStatus,
    GroupCost,
    GroupCounts,
    GroupLimitsSpec,
    GroupPhase,
)
from .schema_run import (
    MAX_BATCH_RUNS,
    TERMINAL_PHASES,
    AgentRun,
    AgentRunList,
    AgentRunSpec,
    AgentRunStatus,
    AnswerStatus,
    CostStatus,
    RunPhase,
    SandboxStatus,
    Turn,
    at_cost_cap,
    awaiting_message,
    member_run_name,
)
from .schema_webhook import Webhook, WebhookSpec, WebhookStatus

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
    "Budget",
    "BudgetSpec",
    "BudgetStatus",
    "Webhook",
    "WebhookSpec",
    "WebhookStatus",
    "SHORT_NAMES",
    "parse_resource",
    "parse_duration",
    "validate_dns_label",
]


Resource = Agent | AgentRun | AgentGroup | Secret | Token

KINDS: dict[str, type[StrictModel]] = {
    "Agent": Agent,
    "AgentRun": AgentRun,
    "AgentGroup": AgentGroup,
    "Secret": Secret,
    "Token": Token,
    "Budget": Budget,
    "Webhook": Webhook,
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
    "budget": ("Budget", "budgets"),
    "budgets": ("Budget", "budgets"),
    "webhook": ("Webhook", "webhooks"),
    "webhooks": ("Webhook", "webhooks"),
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
        if not DNS_LABEL.match(value):
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
    if spec.sessionKey is not None:
        refuse("sessionKey", "a run in a group holds no session; send its messages by name")


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
        if parsed.spec.sessionKey is not None:
            raise Invalid(
                f"items[{index}]: AgentRun spec.sessionKey: a session's run is submitted on its own "
                "(one create per submit), not in a batch",
                details={"field": f"items[{index}].spec.sessionKey", "kind": "AgentRun", "index": index},
            )
        runs.append(parsed)
    return runs
