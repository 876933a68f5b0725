"""Keep-alive and Python runs' inboxes: each run's messages, read from storage once, then kept in memory.

The message service appends to them; the run supervisor asks whether a run that parked for a
message has one unread already (then it goes on at once instead of parking).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nodus_ray.store import layout
from nodus_ray.store.storage import Storage

__all__ = ["Inbox", "Inboxes"]

Key = tuple[str, str]


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

    def after(self, seq: int, name: str | None = None) -> dict[str, Any] | None:
        """The first message after ``seq`` (of that ``name`` when one is given)."""
        return next(
            (m for m in self.messages if int(m["seq"]) > seq and (name is None or m.get("name") == name)),
            None,
        )


class Inboxes:
    """Every run's inbox by ``(project, name)``, each read from storage on first use."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._inboxes: dict[Key, Inbox] = {}

    def get(self, key: Key) -> Inbox:
        """The run's inbox (blocking the first time: storage reads; call it in a thread)."""
        inbox = self._inboxes.get(key)
        if inbox is None:
            inbox = Inbox()
            folder = layout.messages_folder(*key)
            for entry in self._storage.list_dir(folder):  # names are zero-padded: sorted is in order
                inbox.add(self._storage.read_json(f"{folder}/{entry}"))
            self._inboxes[key] = inbox
        return inbox

    def unread(self, key: Key, read_seq: int, name: str | None = None) -> bool:
        """Whether the run has a message after the one it read last (of that ``name``: what a
        Python program's ``wait_for_message(name)`` waits for)."""
        if name is None:
            return self.get(key).last_seq > read_seq
        return self.get(key).after(read_seq, name) is not None

    def forget(self, key: Key) -> None:
        """The run was deleted: its inbox goes with it."""
        self._inboxes.pop(key, None)
