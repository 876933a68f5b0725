"""Messages to keep-alive and Python runs: stored once, numbered, delivered once per message key.

A message is written to the run's storage (``messages/<seq>.json``) before it is acknowledged,
so it survives any restart; the run reads messages in sequence order as journaled steps
(`conversation.Conversation`, or a Python program's ``wait_for_message(name)``, which reads
the next message of that name), so a replayed run reads the same messages at the same steps.
A run parked waiting for a message holds no actor: storing one it waits for starts one. A
group member holds no maxActive slot either while it waits: the message moves it to Waiting /
``GroupWait`` and its group's supervisor resumes it when a slot is free (`group_link.start_member`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from nodus.errors import Conflict, Invalid, PayloadTooLarge
from nodus.lifecycle import RUN_TERMINAL_PHASES, RunPhase, RunReason, run_transition
from nodus.resources import MAX_INPUT_BYTES
from nodus_ray.control.inbox import Inboxes
from nodus_ray.control.registry import Registry, is_python
from nodus_ray.control.retention_policy import check_payloads
from nodus_ray.control.run_supervisor import RunSupervisor
from nodus_ray.store import layout
from nodus_ray.store.timestamps import utc_now

__all__ = ["MessageService"]

_MAX_KEY_LENGTH = 255


def _check(payload: Any, message_key: Any, name: Any) -> None:
    if not isinstance(payload, str):
        raise Invalid("payload: a message is text (a JSON string)", details={"field": "payload"})
    if len(payload.encode("utf-8")) > MAX_INPUT_BYTES:
        raise PayloadTooLarge(
            f"payload: a message is at most {MAX_INPUT_BYTES} bytes (256 KiB)", details={"field": "payload"}
        )
    if message_key is not None and not (
        isinstance(message_key, str) and 0 < len(message_key) <= _MAX_KEY_LENGTH and message_key.isprintable()
    ):
        raise Invalid(
            f"messageKey: 1 to {_MAX_KEY_LENGTH} printable characters", details={"field": "messageKey"}
        )
    if not (isinstance(name, str) and 0 < len(name) <= 63):
        raise Invalid(
            'name: the message\'s name, 1 to 63 characters (e.g. "message")', details={"field": "name"}
        )


class MessageService:
    """Storing, reading and delivering a keep-alive run's messages."""

    def __init__(self, registry: Registry, inboxes: Inboxes, supervisor: RunSupervisor) -> None:
        self._registry = registry
        self._inboxes = inboxes
        self._supervisor = supervisor

    async def send_message(
        self,
        project: str,
        name: str,
        payload: Any,
        message_key: str | None = None,
        message_name: str = "message",
    ) -> dict[str, Any]:
        """Store a message for a keep-alive or Python run; the same ``message_key`` again is
        delivered once.

        A run that is working reads it after its current turn (or step); a run waiting for one
        (of this name, for a Python program) gets an actor now. A finished run refuses it
        (``AgentRunFinished``).
        """
        _check(payload, message_key, message_name)
        run = self._registry.run(project, name)
        key = (project, name)
        if not run["spec"].get("keepAlive") and not is_python(run):
            raise Conflict(
                f"agentrun {name!r} is not keepAlive: it ends after its first turn and reads no "
                "messages (create it with spec.keepAlive: true)",
                code="NotKeepAlive",
                details={"kind": "AgentRun", "name": name, "field": "spec.keepAlive"},
            )
        async with self._registry.locks[key]:
            inbox = await asyncio.to_thread(self._inboxes.get, key)
            if message_key and message_key in inbox.by_key:
                return {**_receipt(name, inbox.by_key[message_key]), "duplicate": True}
            phase = run["status"]["phase"]
            if phase in RUN_TERMINAL_PHASES:
                raise Conflict(
                    f"agentrun {name!r} has finished ({phase}) and takes no more messages",
                    code="AgentRunFinished",
                    details={"kind": "AgentRun", "name": name, "phase": phase},
                )
            message = {
                "seq": inbox.last_seq + 1,
                "name": message_name,
                "payload": payload,
                "messageKey": message_key,
                "receivedAt": utc_now(),
            }
            await asyncio.to_thread(
                self._registry.storage.write_json, layout.message(*key, message["seq"]), message
            )
            inbox.add(message)
            status = run["status"]
            status["messages"] = {**(status.get("messages") or {}), "received": message["seq"]}
            waiting = (
                phase == RunPhase.WAITING
                and status.get("reason") == RunReason.AWAITING_MESSAGE
                and (status.get("waitingFor") or {}).get("message") in (None, message_name)
            )
            if waiting:
                _wake(status, run["spec"].get("group"))
            await self._registry.persist_run(key)
        if waiting:
            await self._registry.run_changed(key)  # its phase changed (its group counts it again)
            if not run["spec"].get("group"):
                self._supervisor.supervise(key)
        return {**_receipt(name, message), "duplicate": False}

    async def recover(self) -> None:
        """After a (re)start: a run parked for a message that was stored just before the control
        plane stopped (the message written, the run's wake-up not) goes on now."""
        for key, run in list(self._registry.runs.items()):
            status = run["status"]
            if (status["phase"], status.get("reason")) != (RunPhase.WAITING, RunReason.AWAITING_MESSAGE):
                continue
            waiting_for = status.get("waitingFor") or {}
            name = waiting_for.get("message")
            after = (
                int(waiting_for.get("after") or 0)
                if name
                else int((status.get("messages") or {}).get("read") or 0)
            )
            if not await asyncio.to_thread(self._inboxes.unread, key, after, name):
                continue
            async with self._registry.locks[key]:
                if (status["phase"], status.get("reason")) != (RunPhase.WAITING, RunReason.AWAITING_MESSAGE):
                    continue
                _wake(status, run["spec"].get("group"))
                await self._registry.persist_run(key)
            await self._registry.run_changed(key)
            if not run["spec"].get("group"):
                self._supervisor.supervise(key)

    async def next_message(
        self, project: str, name: str, after_seq: int, message_name: str | None = None
    ) -> dict[str, Any] | None:
        """The first message after ``after_seq`` (of that name when given: what a Python
        program's ``wait_for_message(name)`` reads), or None."""
        check_payloads(self._registry.run(project, name), "messages")
        inbox = await asyncio.to_thread(self._inboxes.get, (project, name))
        message = inbox.after(int(after_seq), message_name)
        if message is None:
            return None
        return {key: message[key] for key in ("seq", "name", "payload", "messageKey")}


def _wake(status: dict[str, Any], group: str | None) -> None:
    """A message came to a run waiting for one: it goes on (Running) now, or, in a group, waits
    for a free maxActive slot (Waiting / GroupWait) that its supervisor gives it (decision 48)."""
    if group:
        status.update(
            {
                "reason": RunReason.GROUP_WAIT.value,
                "message": f"a message arrived; the run reads it when group {group!r} has a free "
                "place (spec.limits.maxActive)",
            }
        )
        return
    status.update(run_transition(status, RunPhase.RUNNING, None, "a message arrived"))


def _receipt(name: str, message: dict[str, Any]) -> dict[str, Any]:
    return {
        "run": name,
        "seq": message["seq"],
        "name": message["name"],
        "messageKey": message.get("messageKey"),
        "receivedAt": message["receivedAt"],
    }
