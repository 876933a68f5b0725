"""The ready-made agents every project may run: project ``nodus``'s templates.

The documents (001, 002) name one: ``claude-assistant``, a careful general assistant with the
shell, on Nodus's Claude with every model family. The control plane creates it in project
`TEMPLATE_PROJECT` when it starts and finds it absent (`ensure_templates`, after the resources
are loaded and before any call is served), so a fresh installation has it and an operator's
edit of it is kept across restarts.

How another project runs it (decision 47): a run (or a group) names it by its plain name,
``spec.agent: claude-assistant``. An Agent of that name in the caller's own project comes first;
only when the project has none does the name mean the template (`resolve_agent`). The run is an
ordinary run of the caller's project: it lives there, is billed there (credits, caps), and is
pinned to the template's revision like any run (``status.agentRevision``), with
``status.agentProject: nodus`` saying whose revision that is. The ingress (`nodus_serve.auth`)
lets every token read a template and refuses every other project's change to it with
``Forbidden`` (`is_template`).
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Any

from nodus.resources import API_VERSION
from nodus.schema_common import Family

if TYPE_CHECKING:
    from nodus_ray.control.agents import AgentService
    from nodus_ray.control.registry import Registry

__all__ = [
    "TEMPLATE_PROJECT",
    "TEMPLATE_LABEL",
    "CLAUDE_ASSISTANT",
    "template_documents",
    "is_template",
    "ensure_templates",
    "resolve_agent",
]

TEMPLATE_PROJECT = "nodus"
TEMPLATE_LABEL = "nodus.dev/template"  # "true" on a template: the SDK submits to it from elsewhere
CLAUDE_ASSISTANT = "claude-assistant"

_CLAUDE_ASSISTANT_SYSTEM = """\
You are a careful general assistant. You work in a sandbox with a shell: run commands to look \
things up and to check your work instead of guessing, read a command's output before you rely on \
it, and say so when something could not be checked. Do only what the task asks, change nothing \
the task did not mention, and answer in a few clear sentences with what you found and how you \
know it."""


def template_documents() -> list[dict[str, Any]]:
    """The templates as Agent documents (what `ensure_templates` applies when one is absent)."""
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "Agent",
            "metadata": {"name": CLAUDE_ASSISTANT, "labels": {TEMPLATE_LABEL: "true"}},
            "spec": {
                "system": _CLAUDE_ASSISTANT_SYSTEM,
                # Every family the router may choose among, listed so the Agent shows it.
                "model": {"access": "Nodus", "families": list(typing.get_args(Family))},
                "maxTokens": 4096,
                "perRunMaxCostUSD": "1.00",
            },
        }
    ]


_TEMPLATE_NAMES = frozenset(str(document["metadata"]["name"]) for document in template_documents())


def is_template(project: str, name: str) -> bool:
    """Whether ``project``/``name`` is one of the ready-made templates (every token reads it)."""
    return project == TEMPLATE_PROJECT and name in _TEMPLATE_NAMES


async def ensure_templates(agents: AgentService, registry: Registry) -> list[str]:
    """Create the templates that are absent; returns the names created. Runs after the registry
    has loaded (an absent one is really absent, not unread), so an existing template, edited by
    the operator or not, keeps its revisions."""
    created = []
    for document in template_documents():
        name = str(document["metadata"]["name"])
        if (TEMPLATE_PROJECT, name) in registry.agents:
            continue
        await agents.apply_agent(TEMPLATE_PROJECT, document, mode="apply")
        created.append(name)
    return created


def resolve_agent(registry: Registry, project: str, name: str) -> dict[str, Any] | None:
    """The Agent a run or a group of ``project`` names: its own first, else the template."""
    found = registry.agents.get((project, name))
    if found is None and name in _TEMPLATE_NAMES:
        found = registry.agents.get((TEMPLATE_PROJECT, name))
    return found
