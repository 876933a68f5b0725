"""What a run actor is started with: everything pinned when the run was created.

A dataclass apart from the actor so the control plane (`control.run_config` builds it), the
run pool and the tests name it without importing the actor's machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunConfig", "actor_resources"]


@dataclass(frozen=True)
class RunConfig:
    """Everything an actor needs, pinned when the run was created (never read from the Agent)."""

    project: str
    name: str
    agent: str
    agent_revision: int
    agent_spec: dict[str, Any]
    run_spec: dict[str, Any]
    storage_uri: str
    workspace: str
    deadline_at: str | None
    offline_latency_seconds: float = 0.0
    sandbox_uid: int | None = None
    hidden_paths: tuple[str, ...] = ()
    cap_usd: str | None = None
    prices_file: str | None = None
    group: str | None = None
    workspace_snapshots: bool = True
    workspace_seeded: bool = False  # an evaluation task's files are its first workspace
    egress_private_networks: str = ""  # the operator's NODUS_EGRESS_PRIVATE_NETWORKS
    attempt: int = 0  # status.attempts when this actor was started: its epoch (`durable.fencing`)
    program_cpu_seconds: int = 3600  # a Python program's CPU seconds (NODUS_PROGRAM_CPU_SECONDS)
    # A Python program's journal generation (``continue_as_new``, `control.generations`): its
    # input (None: the run's own), its journal's first seq, what the earlier ones cost, the
    # last message seq of each name they took.
    generation: int = 0
    generation_input: str | None = None
    journal_first_seq: int = 0
    prior_cost_usd: str = "0"
    prior_sandbox_usd: str = "0"  # the earlier generations' sandbox charges (``priorSandboxUSD``)
    messages_read: dict[str, int] = field(default_factory=dict)
    # The run's pinned image (``status.sandbox.image``: ref and digest), unpacked on the actor's
    # node under ``images_cache`` (`nodus_ray.sandbox.images`); None: commands run on the host's root.
    image: dict[str, str] | None = None
    images_cache: str = ""
    # The run's ``metadata.uid`` (its trace id) and the server's ``OTEL_*`` settings: empty,
    # no tracing (`nodus_ray.tracing`, decision 57).
    uid: str = ""
    telemetry: tuple[tuple[str, str], ...] = ()
    rate_limits: str = ""  # the operator's NODUS_RATE_LIMITS, checked (`core.rate_limits`)


def actor_resources(agent_spec: dict[str, Any]) -> dict[str, float]:
    """The Ray resources a run actor of this Agent asks for: ``spec.cpu`` as CPUs and
    ``spec.memory`` as memory, so Ray places it where they are free; none by default (a run
    actor waits on its model and its sandbox far more than it computes)."""
    from nodus.schema_agent import memory_bytes  # the schema's own reading of "2Gi"

    wanted: dict[str, float] = {}
    if agent_spec.get("cpu"):
        wanted["num_cpus"] = float(agent_spec["cpu"])
    if agent_spec.get("memory"):
        wanted["memory"] = float(memory_bytes(str(agent_spec["memory"])))
    return wanted
