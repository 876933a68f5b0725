"""Removing a run's workspace directory on the node it ran on (retention, `control.retention`).

A workspace lives on the disk of the node whose actor ran the run (``status.sandbox.nodeId``);
the control plane reaches only its own node's disk. For a run that ran elsewhere, a zero-CPU
Ray task pinned to that node (hard affinity) removes the directory and its marker. A node that
is gone took its disk with it: nothing to remove there. Best effort: a node that does not
answer in time keeps its copy until it is cleaned, as with any leftover (`workspace_sweep`);
the snapshots in storage, which a run would restore from, are deleted by the caller anyway.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import Any

__all__ = ["remove_on_node"]

logger = logging.getLogger(__name__)

_TIMEOUT_SECONDS = 60.0
_remote_remove: Any = None  # the Ray task, made on first use (this module imports Ray lazily)


def _remove(path: str) -> bool:
    """On the node: the workspace directory and its marker (`sandbox.snapshots`)."""
    from nodus_ray.sandbox.snapshots import WorkspaceSnapshots

    workspace = Path(path)
    shutil.rmtree(workspace, ignore_errors=True)
    WorkspaceSnapshots.marker_of(workspace).unlink(missing_ok=True)
    return True


def _alive_nodes() -> set[str]:
    import ray

    return {str(node["NodeID"]) for node in ray.nodes() if node.get("Alive")}  # type: ignore[no-untyped-call]


async def remove_on_node(node_id: str, path: str) -> bool:
    """Remove ``path`` on node ``node_id`` unless that is this node (the caller's own) or gone;
    True when a task removed it there."""
    global _remote_remove
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized() or node_id == ray.get_runtime_context().get_node_id():
        return False
    if node_id not in await asyncio.to_thread(_alive_nodes):
        return False
    if _remote_remove is None:
        _remote_remove = ray.remote(num_cpus=0, max_retries=1)(_remove)
    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    try:
        ref = _remote_remove.options(scheduling_strategy=strategy).remote(path)
        return bool(await asyncio.wait_for(ref, timeout=_TIMEOUT_SECONDS))
    except Exception:  # noqa: BLE001 - best effort: the node keeps its copy until it is cleaned
        logger.warning("could not remove workspace %s on node %s", path, node_id, exc_info=True)
        return False
