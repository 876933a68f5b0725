"""MessageService over real local storage: refusals, storing once per key, waking a parked run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nodus.errors import Conflict, Invalid, PayloadTooLarge
from tests.unit.test_control_support import agent_doc, make_plane, run_doc, until


def test_a_message_is_stored_numbered_and_delivered_once_per_key(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        messages = plane.services.messages
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("chat", keepAlive=True))
        first = await messages.send_message("demo", "chat", "one", message_key="k-1")
        assert (first["seq"], first["duplicate"]) == (1, False)
        again = await messages.send_message("demo", "chat", "one, again", message_key="k-1")
        assert (again["seq"], again["duplicate"]) == (1, True)
        second = await messages.send_message("demo", "chat", "two", message_name="note")
        assert second["seq"] == 2
        assert plane.storage.list_dir("projects/demo/agentruns/chat/messages") == [
            "00000001.json",
            "00000002.json",
        ]
        assert (
            plane.storage.read_json("projects/demo/agentruns/chat/messages/00000001.json")["payload"] == "one"
        )
        run = await plane.services.runs.get_run("demo", "chat")
        assert run["status"]["messages"]["received"] == 2

        restarted = await plane.restart()  # the inbox is read back from storage
        after = restarted.services.messages
        assert (await after.next_message("demo", "chat", 0))["payload"] == "one"  # type: ignore[index]
        assert (await after.next_message("demo", "chat", 1))["name"] == "note"  # type: ignore[index]
        assert await after.next_message("demo", "chat", 2) is None
        assert (await after.send_message("demo", "chat", "x", message_key="k-1"))["duplicate"] is True

    asyncio.run(scenario())


def test_refusals_name_their_reason(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        messages = plane.services.messages
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("once"))
        await plane.services.runs.create_run("demo", run_doc("chat", keepAlive=True))
        with pytest.raises(Conflict) as not_keep_alive:
            await messages.send_message("demo", "once", "hi")
        assert not_keep_alive.value.code == "NotKeepAlive"
        with pytest.raises(Invalid) as not_text:
            await messages.send_message("demo", "chat", {"a": 1})
        assert not_text.value.details["field"] == "payload"
        with pytest.raises(PayloadTooLarge):
            await messages.send_message("demo", "chat", "x" * (256 * 1024 + 1))
        with pytest.raises(Invalid) as bad_key:
            await messages.send_message("demo", "chat", "hi", message_key="")
        assert bad_key.value.details["field"] == "messageKey"
        await plane.services.runs.cancel_run("demo", "chat")
        with pytest.raises(Conflict) as finished:
            await messages.send_message("demo", "chat", "hi")
        assert finished.value.code == "AgentRunFinished"
        assert plane.storage.list_dir("projects/demo/agentruns/chat/messages") == []

    asyncio.run(scenario())


def test_a_message_wakes_a_run_parked_for_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("chat", keepAlive=True))
        (first,) = await until(lambda: plane.run_actors.of("chat"), what="the run's actor")
        first.end({"phase": "Waiting", "reason": "AwaitingMessage"})
        await until(lambda: plane.stored_phase("chat") == "Waiting", what="the run parked for a message")
        await until(lambda: first.killed, what="the parked run's actor given back")
        await plane.services.messages.send_message("demo", "chat", "wake up")
        stored = plane.storage.read_json("projects/demo/agentruns/chat/run.json")
        assert (stored["status"]["phase"], stored["status"]["message"]) == ("Running", "a message arrived")
        await until(lambda: plane.run_actors.of("chat")[1:], what="a new actor for the woken run")
        assert len(plane.run_actors.of("chat")) == 2

    asyncio.run(scenario())
