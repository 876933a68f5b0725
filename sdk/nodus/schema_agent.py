"""The Agent: its system prompt, the Claude access it runs on, its cost cap, and what its commands
get (variables, secret keys, the hosts they may reach).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StrictInt, model_validator

from .egress_policy import MAX_ALLOWED_HOSTS, validate_allowed_host
from .schema_common import (
    API_VERSION,
    MAX_INPUT_BYTES,
    DnsLabel,
    Family,
    ObjectMeta,
    OpenModel,
    StrictModel,
    UsdAmount,
)

__all__ = [
    "ModelSpec",
    "SecretKeyRef",
    "EnvVarSource",
    "EnvVar",
    "NetworkSpec",
    "RESERVED_ENV",
    "MAX_ENV_VARS",
    "AgentSpec",
    "AgentStatus",
    "Agent",
]


class ModelSpec(StrictModel):
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


class SecretKeyRef(StrictModel):
    name: DnsLabel  # a Secret of the Agent's project
    key: str = Field(min_length=1, max_length=128)


class EnvVarSource(StrictModel):
    secretKeyRef: SecretKeyRef


class EnvVar(StrictModel):
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


class NetworkSpec(StrictModel):
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


class AgentSpec(StrictModel):
    system: str = Field(default="", max_length=MAX_INPUT_BYTES)
    model: ModelSpec = Field(default_factory=ModelSpec)
    maxTokens: StrictInt = Field(default=1024, ge=1, le=128_000)
    maxToolCalls: StrictInt = Field(default=50, ge=1, le=1000)
    perRunMaxCostUSD: UsdAmount = "1.00"
    image: str | None = Field(default=None, max_length=512)
    state: Literal["Running", "Stopped"] = "Running"
    env: Annotated[list[EnvVar], AfterValidator(_unique_env)] = Field(
        default_factory=list, max_length=MAX_ENV_VARS
    )
    network: NetworkSpec | None = None


class AgentStatus(OpenModel):
    revision: int = 0
    updatedAt: str | None = None


class Agent(StrictModel):
    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["Agent"] = "Agent"
    metadata: ObjectMeta
    spec: AgentSpec = Field(default_factory=AgentSpec)
    status: AgentStatus | None = None
