"""What a run waiting for a person says: which step, why only a person can decide, and the
evidence there is (the connections an interrupted command made through the egress proxy).

A run that reaches nothing outside undoes an interrupted command by itself (its workspace is
put back and the command runs again); only a step that may have had an effect outside the
sandbox, a command of a run with ``spec.network.allowedHosts`` or a model call on the user's
own key, parks the run ``Waiting`` / ``NeedsResolution``. Its ``status.message`` is built here.
"""

from __future__ import annotations

from typing import Any

from nodus_ray.durable.steps import NeedsResolution
from nodus_ray.egress.run_egress import read_command_egress
from nodus_ray.store.storage import Storage

__all__ = ["command_evidence", "needs_resolution_message", "connections_text"]

_SHOWN_CONNECTIONS = 3  # connections the message names; the step's detail holds all of them


def command_evidence(storage: Storage, run_prefix: str, seq: int) -> dict[str, Any]:
    """The evidence the NeedsResolution record of the command started at ``seq`` keeps:
    ``{"egress": {"recorded": bool, "connections": [...]}}``. ``recorded`` False: nothing was
    written for it (the actor stopped before the command ran), so nothing is known."""
    try:
        connections = read_command_egress(storage, run_prefix, seq)
    except Exception:  # noqa: BLE001 - an unreadable record is evidence unknown, not a crash
        connections = None
    return {"egress": {"recorded": connections is not None, "connections": connections or []}}


def _size(count: Any) -> str:
    value = int(count or 0)
    return f"{value} B" if value < 1024 else f"{value / 1024:.1f} kB"


def connections_text(egress: dict[str, Any] | None) -> str:
    """``made no connections`` / ``its connections: example.com:443 allowed (517 B up, 3.1 kB
    down), ...``: the evidence in a sentence."""
    if not isinstance(egress, dict) or not egress.get("recorded"):
        return "its connections were not recorded"
    connections = [c for c in egress.get("connections") or [] if isinstance(c, dict)]
    if not connections:
        return "it made no connections"
    parts = []
    for connection in connections[:_SHOWN_CONNECTIONS]:
        state = connection.get("outcome") or "?"
        if not connection.get("ended", True):
            state = "open when it stopped"
        parts.append(
            f"{connection.get('host')}:{connection.get('port')} {state} "
            f"({_size(connection.get('bytesUp'))} up, {_size(connection.get('bytesDown'))} down)"
        )
    more = len(connections) - _SHOWN_CONNECTIONS
    tail = f" and {more} more" if more > 0 else ""
    plural = "s" if len(connections) != 1 else ""
    return f"its {len(connections)} connection{plural}: " + ", ".join(parts) + tail


def needs_resolution_message(parked: NeedsResolution, run: str, allowed_hosts: list[str]) -> str:
    """The run's ``status.message`` while it waits for a person to resolve ``parked.step_id``."""
    step = parked.step_id
    if parked.kind == "command":
        hosts = ", ".join(allowed_hosts) or "none"
        why = (
            f"step {step} (command) was interrupted and may have reached outside the sandbox "
            f"(allowedHosts: {hosts}), so it is not run again by itself; "
            f"{connections_text(parked.evidence.get('egress'))}"
        )
    elif parked.kind == "model":
        why = (
            f"step {step} (model call on your own key) was interrupted and may have been billed "
            "to you, so it is not made again by itself"
        )
    else:
        why = str(parked)
    return (
        f"{why}; resolve step {step}: `nodus agentrun resolve {run} --step {step} "
        "--decision Completed|NoEffect|Cancelled` (`nodus agentrun steps` shows the evidence)"
    )
