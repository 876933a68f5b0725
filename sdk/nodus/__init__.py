"""nodus: the client SDK of nodus-ray, durable LLM agent runs on Ray.

This package talks to the nodus API over HTTP and never imports Ray, so a laptop with only the
SDK can define agents, submit runs and read their answers; the server parts live in
``nodus_ray``.
"""

from . import errors, resources
from .agent import Agent, ClaudeAgent, Egress, SecretKey
from .agent_map import AgentMap
from .agent_run import AgentRun, RunContext
from .budget import Budget
from .client import Client
from .group import AgentGroup
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
    "errors",
    "resources",
    "__version__",
]
