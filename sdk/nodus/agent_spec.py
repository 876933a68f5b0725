"""A Claude agent's parameters, declared once: `ClaudeAgent(...)`, ``nodus create agent`` and the
Agent spec are three spellings of the same settings, and `AGENT_PARAMS` is the table between them.

Each `AgentParam` names the setting as Python takes it (``per_run_max_cost``), where it lands in
the Agent spec (``perRunMaxCostUSD``), the CLI flag that sets it (``--max-cost``, or none) and
its help. `claude_agent_spec` builds the spec from the table, for the SDK and the CLI alike; the
CLI takes its flags and help from it; a unit test holds `ClaudeAgent`'s signature, the CLI's
options and the schema's fields to it, so a setting added in one place and not the others fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from .durations import format_duration
from .errors import Invalid
from .handles import _usd

__all__ = [
    "SecretKey",
    "Egress",
    "AgentParam",
    "AGENT_PARAMS",
    "agent_param",
    "claude_agent_spec",
    "python_agent_spec",
    "worker_settings",
]


@dataclass(frozen=True)
class SecretKey:
    """One key of a Secret, as the value of an environment variable of the agent's commands:
    ``env={"DB_PASSWORD": nodus.SecretKey("db", "PASSWORD")}``. The value never leaves the
    server, and is redacted from everything a run records."""

    secret: str
    key: str


@dataclass(frozen=True)
class Egress:
    """Where a run's code (its commands, a Python agent's program) may connect: only the listed
    hosts, through the egress proxy (docs/network.md): ``nodus.Egress(allowed_hosts=["api.github.com"])``.
    Entries are ``example.com``, ``*.example.com`` or an address, each with an optional ``:port``."""

    allowed_hosts: Sequence[str] = ()

    def __post_init__(self) -> None:
        if isinstance(self.allowed_hosts, str) or not all(isinstance(h, str) for h in self.allowed_hosts):
            raise Invalid(
                'Egress(allowed_hosts=...) takes a list of hosts, e.g. ["api.github.com"]',
                details={"field": "network.allowedHosts"},
            )


def _env_entries(env: Mapping[str, str | SecretKey]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for name, value in env.items():
        if isinstance(value, SecretKey):
            entries.append(
                {"name": name, "valueFrom": {"secretKeyRef": {"name": value.secret, "key": value.key}}}
            )
        else:
            entries.append({"name": name, "value": value})
    return entries


def _same(value: Any) -> Any:
    return value


def _cost(value: Any) -> str | None:
    return _usd(value, "per_run_max_cost")


@dataclass(frozen=True)
class AgentParam:
    """One setting of a Claude agent, as each surface spells it."""

    name: str  # the keyword of ClaudeAgent(...) and claude_agent_spec(...)
    field: str  # where it lands in the Agent spec, dotted ("model.families")
    help: str  # one line; the CLI's --help shows it
    flag: str | None = None  # the `nodus create agent` option, None when the CLI does not offer it
    to_spec: Callable[[Any], Any] = _same  # the Python value -> the spec's
    # When the setting is left out of the spec: None given ("none"), None or empty ("empty"), or
    # never (the spec always carries it).
    omit: Literal["none", "empty", "never"] = "none"


# In the order the spec is written (the server sees the same document as before the table).
AGENT_PARAMS: tuple[AgentParam, ...] = (
    AgentParam("system", "system", "The system prompt.", "--system", omit="never"),
    AgentParam(
        "families",
        "model.families",
        "Allowed Claude family (repeatable): haiku, sonnet, opus, fable.",
        "--family",
        to_spec=list,
        omit="empty",
    ),
    AgentParam("model", "model.name", "A Claude model id to pin.", "--model"),
    AgentParam(
        "api_key_secret", "model.apiKeySecret", "Secret with ANTHROPIC_API_KEY (BYOK).", "--api-key-secret"
    ),
    AgentParam("max_tokens", "maxTokens", "Output tokens per model call.", "--max-tokens"),
    AgentParam("max_tool_calls", "maxToolCalls", "Commands allowed per turn."),
    AgentParam(
        "per_run_max_cost",
        "perRunMaxCostUSD",
        "Per-run model cost cap in USD, e.g. 0.50.",
        "--max-cost",
        to_spec=_cost,
    ),
    AgentParam(
        "image",
        "image",
        "The OCI image commands run on: docker://NAME[:TAG], oci:/PATH[:TAG] or oci-archive:/FILE[:TAG].",
    ),
    AgentParam(
        "env",
        "env",
        "NAME=VALUE, or NAME=secret:SECRET/KEY for a Secret's key (repeatable).",
        "--env",
        to_spec=_env_entries,
        omit="empty",
    ),
    AgentParam(
        "allowed_hosts",
        "network.allowedHosts",
        "A host the run's commands may reach, e.g. pypi.org (repeatable).",
        "--allow-host",
        to_spec=list,
    ),
)

_BY_NAME = {param.name: param for param in AGENT_PARAMS}


def agent_param(name: str) -> AgentParam:
    """The table's row for ``name`` (``"per_run_max_cost"``); a KeyError for one it lacks."""
    return _BY_NAME[name]


def claude_agent_spec(
    *,
    system: str = "",
    families: list[str] | None = None,
    model: str | None = None,
    max_tokens: int | None = None,
    max_tool_calls: int | None = None,
    per_run_max_cost: Any = None,
    api_key_secret: str | None = None,
    image: str | None = None,
    env: Mapping[str, str | SecretKey] | None = None,
    allowed_hosts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The Agent spec of a Claude agent; shared by `ClaudeAgent` and ``nodus create agent``.

    The model's access follows from the key: ``BYOK`` with an ``api_key_secret``, else ``Nodus``.
    """
    given = locals()
    spec: dict[str, Any] = {"system": system, "model": {"access": "BYOK" if api_key_secret else "Nodus"}}
    for param in AGENT_PARAMS:
        value = given[param.name]
        if (param.omit == "none" and value is None) or (param.omit == "empty" and not value):
            continue
        *parents, leaf = param.field.split(".")
        place = spec
        for parent in parents:
            place = place.setdefault(parent, {})
        place[leaf] = param.to_spec(value)
    return spec


def _secret_entries(secrets: Sequence[Any]) -> list[dict[str, Any]]:
    """``secrets=[SecretKey("github", "GITHUB_TOKEN")]``: each key is a variable of that name."""
    entries: list[dict[str, Any]] = []
    for index, item in enumerate(secrets):
        if not isinstance(item, SecretKey):
            raise Invalid(
                f"secrets[{index}]: a nodus.SecretKey(secret, key), not {type(item).__name__}; the key "
                "is the variable's name (env={NAME: SecretKey(...)} names it otherwise)",
                details={"field": "secrets"},
            )
        entries.append(
            {"name": item.key, "valueFrom": {"secretKeyRef": {"name": item.secret, "key": item.key}}}
        )
    return entries


def _cpu(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Invalid("cpu is a number of cores, e.g. 1 or 0.5", details={"field": "cpu"})
    return float(value)


def python_agent_spec(
    *,
    image: str | None = None,
    setup: str | None = None,
    secrets: Sequence[Any] | None = None,
    env: Mapping[str, str | SecretKey] | None = None,
    network: Egress | None = None,
    models: Sequence[str] | None = None,
    per_run_max_cost: Any = None,
    max_cost: Any = None,
    cpu: Any = None,
    memory: str | None = None,
) -> dict[str, Any]:
    """The Agent spec of `nodus.Agent(...)` without its program (``source`` and ``entrypoint``
    are added at deploy, once the entrypoint is known); unset settings are left out, so an
    Agent with none of them sends the document it always did."""
    spec: dict[str, Any] = {}
    if image is not None:
        spec["image"] = image
    if models:
        if isinstance(models, str):
            raise Invalid(
                'models is a list of families, e.g. ["haiku", "sonnet"]', details={"field": "models"}
            )
        spec["model"] = {"access": "Nodus", "families": list(models)}
    cost = _usd(per_run_max_cost, "per_run_max_cost")
    if cost is not None:
        spec["perRunMaxCostUSD"] = cost
    entries = _secret_entries(secrets or ()) + _env_entries(env or {})
    if entries:
        spec["env"] = entries
    if network is not None:
        if not isinstance(network, Egress):
            raise Invalid("network takes nodus.Egress(allowed_hosts=[...])", details={"field": "network"})
        spec["network"] = {"allowedHosts": list(network.allowed_hosts)}
    if setup is not None:
        if not isinstance(setup, str):
            raise Invalid("setup is a shell script (a str)", details={"field": "setup"})
        spec["setup"] = setup
    cores = _cpu(cpu)
    if cores is not None:
        spec["cpu"] = cores
    if memory is not None:
        if not isinstance(memory, str):
            raise Invalid('memory is an amount such as "512Mi" or "2Gi"', details={"field": "memory"})
        spec["memory"] = memory
    total = _usd(max_cost, "max_cost")
    if total is not None:
        spec["maxCostUSD"] = total
    return spec


def worker_settings(min_workers: Any, max_workers: Any, scaledown_window: Any) -> dict[str, Any]:
    """``spec.minWorkers``/``maxWorkers``/``scaledownWindow``, only those given (an Agent that
    sets none sends the document it always did); the server checks their ranges."""
    spec: dict[str, Any] = {}
    for arg, field, value in (
        ("min_workers", "minWorkers", min_workers),
        ("max_workers", "maxWorkers", max_workers),
    ):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(f"{arg} is a whole number of run actors", details={"field": arg})
        spec[field] = value
    if scaledown_window is not None:
        if isinstance(scaledown_window, timedelta):
            scaledown_window = format_duration(scaledown_window)
        if not isinstance(scaledown_window, str):
            raise Invalid(
                'scaledown_window is a duration such as "5m" or a timedelta',
                details={"field": "scaledown_window"},
            )
        spec["scaledownWindow"] = scaledown_window
    return spec
