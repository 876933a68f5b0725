"""Messages to keep-alive runs: stored once, numbered, delivered once per message key.

The control plane mixes this in. A message is written to the run's storage
(``messages/<seq>.json``) before it is acknowledged, so it survives any restart; the run reads
messages in sequence order as journaled steps (`conversation.Conversation`), so a replayed run
reads the same messages in the same turns. A run parked waiting for a message holds no actor:
storing a message for it starts one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nodus.errors import Conflict, Invalid, PayloadTooLarge
from nodus.resources import MAX_INPUT_BYTES, TERMINAL_PHASES
from nodus_ray.runtime.run_actor import run_storage_prefix
from nodus_ray.store.storage import Storage
from nodus_ray.store.timestamps import utc_now

__all__ = ["RunMessages", "Inbox"]

Key = tuple[str, str]

_MAX_KEY_LENGTH = 255


@dataclass
class Inbox:
    """One run's messages, in memory after the first read of its storage."""

    messages: list[dict[str, Any]] = field(default_factory=list)  # in sequence order
    by_key: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        if message.get("messageKey"):
            self.by_key[message["messageKey"]] = message

    @property
    def last_seq(self) -> int:
        return int(self.messages[-1]["seq"]) if self.messages else 0

    def after(self, seq: int) -> dict[str, Any] | None:
        return next((m for m in self.messages if int(m["seq"]) > seq), None)


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


class RunMessages:
    """Storing, reading and delivering messages; the control plane provides what is declared here."""

    storage: Storage
    _runs: dict[Key, dict[str, Any]]
    _locks: Any
    _inboxes: dict[Key, Inbox]
    get_run: Callable[..., Any]
    _persist_run: Callable[..., Any]
    _supervise: Callable[[Key], None]

    def _inbox(self, key: Key) -> Inbox:
        inbox = self._inboxes.get(key)
        if inbox is None:
            inbox = Inbox()
            prefix = f"{run_storage_prefix(*key)}/messages"
            for entry in self.storage.list_dir(prefix):  # names are zero-padded: sorted is in order
                inbox.add(self.storage.read_json(f"{prefix}/{entry}"))
            self._inboxes[key] = inbox
        return inbox

    def _unread(self, key: Key, read_seq: int) -> bool:
        return self._inbox(key).last_seq > read_seq

    async def send_message(
        self,
        project: str,
        name: str,
        payload: Any,
        message_key: str | None = None,
        message_name: str = "message",
    ) -> dict[str, Any]:
        """Store a message for a keep-alive run; the same ``message_key`` again is delivered once.

        A run that is working reads it after its current turn; a run waiting for one gets an
        actor now. A finished run refuses it (``AgentRunFinished``).
        """
        _check(payload, message_key, message_name)
        run = await self.get_run(project, name)
        key = (project, name)
        if not run["spec"].get("keepAlive"):
            raise Conflict(
                f"agentrun {name!r} is not keepAlive: it ends after its first turn and reads no "
                "messages (create it with spec.keepAlive: true)",
                code="NotKeepAlive",
                details={"kind": "AgentRun", "name": name, "field": "spec.keepAlive"},
            )
        async with self._locks[key]:
            inbox = await asyncio.to_thread(self._inbox, key)
            if message_key and message_key in inbox.by_key:
                return {**self._receipt(name, inbox.by_key[message_key]), "duplicate": True}
            phase = run["status"]["phase"]
            if phase in TERMINAL_PHASES:
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
                self.storage.write_json,
                f"{run_storage_prefix(*key)}/messages/{message['seq']:08d}.json",
                message,
            )
            inbox.add(message)
            status = run["status"]
            status["messages"] = {**(status.get("messages") or {}), "received": message["seq"]}
            waiting = phase == "Waiting" and status.get("reason") == "AwaitingMessage"
            if waiting:
                status.update({"phase": "Running", "reason": None, "message": "a message arrived"})
            await self._persist_run(key)
        if waiting:
            self._supervise(key)
        return {**self._receipt(name, message), "duplicate": False}

    @staticmethod
    def _receipt(name: str, message: dict[str, Any]) -> dict[str, Any]:
        return {
            "run": name,
            "seq": message["seq"],
            "name": message["name"],
            "messageKey": message.get("messageKey"),
            "receivedAt": message["receivedAt"],
        }

    async def next_message(self, project: str, name: str, after_seq: int) -> dict[str, Any] | None:
        """The first message after ``after_seq`` (what a run reads next), or None."""
        await self.get_run(project, name)
        inbox = await asyncio.to_thread(self._inbox, (project, name))
        message = inbox.after(int(after_seq))
        if message is None:
            return None
        return {key: message[key] for key in ("seq", "name", "payload", "messageKey")}
