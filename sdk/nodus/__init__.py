"""nodus: the client SDK of nodus-ray, durable LLM agent runs on Ray.

This package talks to the nodus API over HTTP and never imports Ray, so a laptop with only the
SDK can define agents, submit runs and read their answers; the server parts live in
``nodus_ray``.

The public names are loaded on first use (PEP 562), not when the package is imported: the
engine's processes import ``nodus.errors``, ``nodus.lifecycle`` and the resource schemas from
here, and a run actor (a fresh process per run) should not pay for the HTTP client, the CLI's
libraries and every schema to get them (issue 19, decision 54).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import errors, resources
    from .agent import Agent, ClaudeAgent, Egress, SecretKey
    from .agent_map import AgentMap
    from .agent_run import AgentRun, RunContext
    from .budget import Budget
    from .client import Client
    from .group import AgentGroup
    from .listing import iter_runs, list_runs
    from .view import View

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "ClaudeAgent",
    "AgentRun",
    "AgentGroup",
    "AgentMap",
    "Budget",
    "RunContext",
    "SecretKey",
    "Egress",
    "View",
    "Client",
    "iter_runs",
    "list_runs",
    "errors",
    "resources",
    "__version__",
]

# Where each public name is defined: the module is imported the first time the name is used.
_HOMES = {
    "Agent": "agent",
    "ClaudeAgent": "agent",
    "Egress": "agent",
    "SecretKey": "agent",
    "AgentMap": "agent_map",
    "AgentRun": "agent_run",
    "RunContext": "agent_run",
    "Budget": "budget",
    "Client": "client",
    "AgentGroup": "group",
    "View": "view",
    "iter_runs": "listing",
    "list_runs": "listing",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
        globals()[name] = value  # the next use is a plain attribute
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # ``nodus.agent``, ``nodus.errors``...
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
