"""What `Agent.submit` sends and how it reads the server's answer into a run handle.

Kept apart from the definition (`agent`): building a run's document (its name from an
idempotency key, a session's keep-alive, the deadline; everything refused before sending) and
the two ways a run is created (a session key's live run answering, or an idempotent redelivery
finding its run) are the run side of the SDK, not the Agent's.
"""

from __future__ import annotations

import hashlib
import secrets as _secrets
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from .agent_run import AgentRun
from .client import Client
from .errors import Conflict, Invalid
from .handles import _encode_input, _format_deadline, _run_name, _unsupported
from .resources import API_VERSION, parse_resource, validate_dns_label

__all__ = ["check_session_key", "create_run", "run_manifest"]


def check_session_key(session_key: Any) -> None:
    """A session key is a DNS label (what the server's ``spec.sessionKey`` takes), refused here
    naming ``session_key`` before anything is sent."""
    try:
        if not isinstance(session_key, str):
            raise ValueError("must be a string")
        validate_dns_label(session_key)
    except ValueError as exc:
        raise Invalid(f"session_key: {exc}", details={"field": "session_key"}) from None


def run_manifest(
    agent: str,
    input: Any,
    *,
    idempotency_key: str | None,
    session_key: str | None,
    deadline: str | timedelta | None,
    group: str | None,
    hold_worker: str | None,
    name: str | None,
    keep_alive: bool,
    labels: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], bool]:
    """The AgentRun document `Agent.submit` creates, checked whole, and whether it is idempotent
    (named by the caller or by an idempotency key)."""
    if group is not None:
        raise _unsupported("submit(group=...)", "submit group runs with AgentGroup.submit_many", "group")
    if session_key is not None:
        check_session_key(session_key)
    if hold_worker not in (None, "auto"):
        raise _unsupported(
            "submit(hold_worker=...) other than 'auto'", "the API does not hold workers", "hold_worker"
        )
    text = _encode_input(input)
    if name is None and idempotency_key is not None:
        name = _run_name(agent, hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:12])
    idempotent = name is not None
    if name is None:
        name = _run_name(agent, _secrets.token_hex(4))
    spec: dict[str, Any] = {"agent": agent, "input": text}
    if deadline is not None:
        spec["deadline"] = _format_deadline(deadline)
    if keep_alive or session_key is not None:
        spec["keepAlive"] = True  # a session's run waits for the session's next message
    if session_key is not None:
        spec["sessionKey"] = session_key
    metadata: dict[str, Any] = {"name": name, **({"labels": dict(labels)} if labels else {})}
    manifest = {"apiVersion": API_VERSION, "kind": "AgentRun", "metadata": metadata, "spec": spec}
    parse_resource(manifest)  # an oversized input, a bad deadline or label is refused before sending
    return manifest, idempotent


def create_run(
    client: Client, project: str | None, manifest: dict[str, Any], *, idempotent: bool, session: bool
) -> AgentRun:
    """Create the run and return its handle: a session's live run when the server answers with
    one, the existing run when an idempotent submit is delivered again."""
    if session:  # the server answers the run holding the key, new or live
        answer = client.create_result("agentruns", manifest, project=project)
        handle = AgentRun(answer.resource, project=project, client=client)
        if answer.result != "created":
            # The input went to the live run as a message: wait() and answer() wait for it.
            messages = (answer.resource.get("status") or {}).get("messages") or {}
            handle._sent_seq = int(messages.get("received") or 0)
        return handle
    name, spec = manifest["metadata"]["name"], manifest["spec"]
    try:
        created = client.create("agentruns", manifest, project=project)
    except Conflict as exc:
        if not (idempotent and exc.code == "AlreadyExists"):
            raise
        existing = client.get("agentruns", name, project=project)
        same = {k: v for k, v in (existing.get("spec") or {}).items() if v not in (None, False)}
        if same != {k: v for k, v in spec.items() if v not in (None, False)}:
            raise Conflict(
                f"agentrun/{name} already exists with a different spec (agent, input or deadline)",
                code="AlreadyExists",
                details={"kind": "AgentRun", "name": name},
            ) from None
        created = existing
    return AgentRun(created, project=project, client=client)
