"""The AgentRun: its spec (agent, input, deadline, group membership), its status (phase, turns,
answer, cost, sandbox), and the batch form (AgentRunList).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StrictBool, model_validator

from .durations import parse_duration
from .schema_common import API_VERSION, MAX_INPUT_BYTES, DnsLabel, ObjectMeta, OpenModel, StrictModel

__all__ = [
    "RunPhase",
    "TERMINAL_PHASES",
    "MAX_BATCH_RUNS",
    "MAX_DEPENDS_ON",
    "awaiting_message",
    "at_cost_cap",
    "Duration",
    "AgentRunSpec",
    "Turn",
    "AnswerStatus",
    "CostStatus",
    "SandboxStatus",
    "PinnedImage",
    "AgentRunStatus",
    "AgentRun",
    "member_run_name",
    "AgentRunList",
]

RunPhase = Literal["Pending", "Running", "Waiting", "Succeeded", "Failed", "Cancelled"]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed", "Cancelled"})

MAX_BATCH_RUNS = 100
MAX_DEPENDS_ON = 100


def awaiting_message(status: dict[str, Any]) -> bool:
    """A keep-alive run that answered its turn and waits for the next message: its turn is done."""
    return status.get("phase") == "Waiting" and status.get("reason") == "AwaitingMessage"


def at_cost_cap(status: dict[str, Any]) -> bool:
    """A run parked at its cost cap: only a cancel or its deadline can end it, so waiters stop."""
    return status.get("phase") == "Waiting" and status.get("reason") == "MaxCostReached"


_MAX_DEADLINE = timedelta(days=30)


def _validate_deadline(value: str) -> str:
    duration = parse_duration(value)
    if duration <= timedelta(0) or duration > _MAX_DEADLINE:
        raise ValueError("must be more than 0s and at most 720h")
    return value


def _validate_input(value: str) -> str:
    if len(value.encode("utf-8")) > MAX_INPUT_BYTES:
        raise ValueError(f"is larger than {MAX_INPUT_BYTES} bytes (256 KiB)")
    return value


Duration = Annotated[str, AfterValidator(_validate_deadline)]


class AgentRunSpec(StrictModel):
    agent: DnsLabel
    input: Annotated[str, AfterValidator(_validate_input)] = ""
    deadline: Duration | None = None
    keepAlive: StrictBool = False
    # The session this run holds (one live run per project, agent and key): a create naming a
    # key that a live run holds delivers the input to that run as a message instead (decision 48).
    sessionKey: DnsLabel | None = None
    # Group membership: the run is task ``taskKey`` of AgentGroup ``group`` and is named
    # ``<group>-<taskKey>``; it starts only once every task in ``dependsOn`` has succeeded.
    group: DnsLabel | None = None
    taskKey: DnsLabel | None = None
    dependsOn: list[DnsLabel] | None = Field(default=None, max_length=MAX_DEPENDS_ON)


class Turn(OpenModel):
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
    # BYOK only (nothing is billed there): the turn's model calls at the price table's list
    # prices; None with ``unpricedModels`` when a model it called has no list price.
    listCostUSD: str | None = None
    unpricedModels: list[str] | None = None
    stopReason: str | None = None
    startedAt: str | None = None
    finishedAt: str | None = None


class AnswerStatus(OpenModel):
    preview: str = ""
    bytes: int = 0
    truncated: bool = False


class CostStatus(OpenModel):
    """What the run cost, billed USD (decision 44).

    ``totalUSD`` is the model spend (model and routing calls), what ``perRunMaxCostUSD`` and a
    group's ``maxCostUSD`` count; ``modelUSD`` the same figure, named plainly. ``sandboxUSD`` is
    the sandbox compute (commands' CPU-seconds, the kept workspace's GiB-hours), billed whatever
    the model access and counted by no cap; ``billedUSD`` both, what a project Budget counts.
    A status written before the sandbox was billed reads as model spend alone.

    A BYOK run (nothing billed for its model calls) also carries ``listUSD``, its model calls at
    the price table's list prices, and ``listNote``; ``listUSD`` is null, with ``listNote``
    saying why, when a model it called has no list price (decision 49). They are left undeclared
    on purpose: a Nodus run has neither, and a declared null would read as "unpriced".
    """

    totalUSD: str = "0"
    modelUSD: str = "0"
    sandboxUSD: str = "0"
    billedUSD: str = "0"
    limitUSD: str | None = None

    @model_validator(mode="after")
    def _derived(self) -> CostStatus:
        if "modelUSD" not in self.model_fields_set:
            self.modelUSD = self.totalUSD
        if "billedUSD" not in self.model_fields_set:
            try:
                self.billedUSD = str(Decimal(self.modelUSD) + Decimal(self.sandboxUSD))
            except ArithmeticError:
                self.billedUSD = self.totalUSD
        return self


class PinnedImage(OpenModel):
    """The Agent's ``spec.image`` as the run was created: the reference and the digest it named
    then, which every actor of the run unpacks (a tag moved later changes nothing)."""

    ref: str
    digest: str


class SandboxStatus(OpenModel):
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
    # When the finished run's workspace was deleted (NODUS_WORKSPACE_RETENTION after it ended).
    workspaceDeletedAt: str | None = None
    image: PinnedImage | None = None  # commands run on this image's root (none: the host's)


class AgentRunStatus(OpenModel):
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
    # When the finished run's recorded payloads were deleted (NODUS_PAYLOAD_RETENTION after it
    # ended): its input, messages, step values, answer, outputs; status, steps and totals remain.
    payloadsExpiredAt: str | None = None
    cost: CostStatus = Field(default_factory=CostStatus)


class AgentRun(StrictModel):
    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["AgentRun"] = "AgentRun"
    metadata: ObjectMeta
    spec: AgentRunSpec
    status: AgentRunStatus | None = None


def member_run_name(group: str, task_key: str) -> str:
    """The name of task ``task_key`` of ``group``: ``<group>-<taskKey>``."""
    return f"{group}-{task_key}"


class AgentRunList(StrictModel):
    """A batch of runs created together (``POST .../agentruns``): all or none, in list order."""

    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["AgentRunList"] = "AgentRunList"
    items: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_BATCH_RUNS)
