"""The Agent: its system prompt, the Claude access it runs on, its cost cap, and what its commands
get (variables, secret keys, the hosts they may reach); for a durable Python agent also its
program (a content-addressed ``source`` and the ``entrypoint`` in it), ``setup`` and limits.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StrictInt, model_validator

from .durations import parse_duration
from .egress_policy import MAX_ALLOWED_HOSTS, validate_allowed_host
from .image_ref import validate_image_ref
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
    "SourceRef",
    "MAX_SOURCE_BYTES",
    "MAX_SOURCE_FILES",
    "MAX_SETUP_BYTES",
    "ENTRYPOINT_PATTERN",
    "source_digest",
    "source_ref",
    "memory_bytes",
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


# A Python agent's program: at most this much text, in this many files (the design's limits).
MAX_SOURCE_BYTES = 4 * 1024 * 1024
MAX_SOURCE_FILES = 1000
MAX_SETUP_BYTES = 16 * 1024
ENTRYPOINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
_DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
_MEMORY = re.compile(r"([1-9][0-9]{0,6})(Mi|Gi)")
_MIB = 1024 * 1024
_MEMORY_MIN, _MEMORY_MAX = 64 * _MIB, 64 * 1024 * _MIB


def source_digest(files: Mapping[str, str]) -> str:
    """``sha256:<hex>`` of a source's files: the same files (in any order) are the same digest.

    The hash is over the canonical JSON of ``{"files": ...}`` (sorted keys, no spaces, UTF-8),
    the document the server stores, so the SDK and the CLI can name a source before uploading it.
    """
    canonical = json.dumps(
        {"files": dict(files)}, sort_keys=True, ensure_ascii=False, separators=(",", ":")
    ).encode("utf-8")
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def source_ref(files: Mapping[str, str]) -> dict[str, object]:
    """``spec.source`` of these files: ``{"digest", "files", "bytes"}`` (bytes of UTF-8 text)."""
    return {
        "digest": source_digest(files),
        "files": len(files),
        "bytes": sum(len(text.encode("utf-8")) for text in files.values()),
    }


def memory_bytes(value: str) -> int:
    """``"512Mi"`` / ``"2Gi"`` in bytes; a ValueError names the form and the range."""
    match = _MEMORY.fullmatch(value)
    if match is None:
        raise ValueError(f'{value[:20]!r} is not an amount of memory such as "512Mi" or "2Gi"')
    amount = int(match.group(1)) * (_MIB if match.group(2) == "Mi" else 1024 * _MIB)
    if not _MEMORY_MIN <= amount <= _MEMORY_MAX:
        raise ValueError(f"{value} is outside 64Mi .. 64Gi")
    return amount


def _validate_memory(value: str) -> str:
    memory_bytes(value)
    return value


def _validate_entrypoint(value: str) -> str:
    if len(value) > 256 or not re.fullmatch(ENTRYPOINT_PATTERN, value):
        raise ValueError(f"{value[:60]!r} is not module:function, e.g. main:main or agents.triage:run")
    return value


def _validate_scaledown_window(value: str) -> str:
    seconds = parse_duration(value).total_seconds()
    if not 10 <= seconds <= 24 * 3600:
        raise ValueError(f"{value!r} is outside 10s..24h (how long an idle pre-started run actor stays)")
    return value


def _validate_setup(value: str) -> str:
    if len(value.encode("utf-8")) > MAX_SETUP_BYTES:
        raise ValueError(f"the setup script is larger than {MAX_SETUP_BYTES} bytes (16 KiB)")
    return value


class SourceRef(StrictModel):
    """A Python agent's uploaded program, by content: its digest, file count and size."""

    digest: str = Field(pattern=_DIGEST_PATTERN)
    files: StrictInt = Field(ge=1, le=MAX_SOURCE_FILES)
    bytes: StrictInt = Field(ge=0, le=MAX_SOURCE_BYTES)


class AgentSpec(StrictModel):
    system: str = Field(default="", max_length=MAX_INPUT_BYTES)
    model: ModelSpec = Field(default_factory=ModelSpec)
    maxTokens: StrictInt = Field(default=1024, ge=1, le=128_000)
    maxToolCalls: StrictInt = Field(default=50, ge=1, le=1000)
    perRunMaxCostUSD: UsdAmount = "1.00"
    # An OCI image reference (`image_ref`): commands run on its root, not the host's.
    image: Annotated[str, AfterValidator(validate_image_ref)] | None = Field(default=None, max_length=512)
    state: Literal["Running", "Stopped"] = "Running"
    env: Annotated[list[EnvVar], AfterValidator(_unique_env)] = Field(
        default_factory=list, max_length=MAX_ENV_VARS
    )
    network: NetworkSpec | None = None
    # A durable Python agent (both or neither of source and entrypoint): system and
    # maxToolCalls do not apply to it; model.families routes its model calls.
    source: SourceRef | None = None
    entrypoint: Annotated[str, AfterValidator(_validate_entrypoint)] | None = None
    setup: Annotated[str, AfterValidator(_validate_setup)] | None = None
    cpu: float | None = Field(default=None, gt=0, le=64, allow_inf_nan=False, strict=True)
    memory: Annotated[str, AfterValidator(_validate_memory)] | None = None
    maxCostUSD: UsdAmount | None = None  # all the Agent's runs together
    # Run actors of the Agent: pre-started ones kept for it, its concurrency limit (runs that
    # hold an actor at once; parked ones hold none), how long an idle pre-started one stays.
    minWorkers: StrictInt | None = Field(default=None, ge=0, le=64)
    maxWorkers: StrictInt | None = Field(default=None, ge=1, le=1000)
    scaledownWindow: Annotated[str, AfterValidator(_validate_scaledown_window)] | None = None

    @model_validator(mode="after")
    def _program(self) -> AgentSpec:
        if self.minWorkers is not None and self.maxWorkers is not None and self.minWorkers > self.maxWorkers:
            raise ValueError(
                f"spec.minWorkers ({self.minWorkers}) is more than spec.maxWorkers ({self.maxWorkers})"
            )
        if (self.source is None) != (self.entrypoint is None):
            missing = "spec.entrypoint" if self.entrypoint is None else "spec.source"
            raise ValueError(
                f"{missing} is missing: a Python agent sets both source and entrypoint (module:function)"
            )
        if self.source is None and self.setup is not None:
            raise ValueError("spec.setup runs before a Python agent's entrypoint; set source and entrypoint")
        return self


class AgentStatus(OpenModel):
    revision: int = 0
    updatedAt: str | None = None


class Agent(StrictModel):
    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["Agent"] = "Agent"
    metadata: ObjectMeta
    spec: AgentSpec = Field(default_factory=AgentSpec)
    status: AgentStatus | None = None
