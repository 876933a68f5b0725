"""ProgramWaits over a real Journal: timers, messages, children, sends and outputs as steps.

A fake control plane plays messages and children; a clock the test moves plays time.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from nodus._runtime import protocol as wire
from nodus_ray.durable.journal import Journal
from nodus_ray.durable.steps import StepFailed, Steps
from nodus_ray.runtime.program.server import Parked
from nodus_ray.runtime.program.waits import MAX_OUTPUT_BYTES, ProgramWaits
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage


class Control:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.sent: list[tuple[Any, ...]] = []
        self.spawned: list[tuple[Any, ...]] = []
        self.children: dict[str, dict[str, Any]] = {}

    async def next_message(
        self, project: str, name: str, after_seq: int, message_name: str | None = None
    ) -> dict[str, Any] | None:
        return next(
            (m for m in self.messages if m["seq"] > after_seq and m["name"] == message_name),
            None,
        )

    async def send_message(self, *args: Any) -> dict[str, Any]:
        self.sent.append(args)
        return {"seq": 1}

    async def spawn_child(self, *args: Any) -> dict[str, Any]:
        self.spawned.append(args)
        name = f"{args[1]}-{args[2]}"
        self.children.setdefault(name, {"name": name, "phase": "Running", "costUSD": "0"})
        return {"name": name}

    async def children_status(self, project: str, parent: str, names: list[str]) -> list[dict[str, Any]]:
        return [self.children[n] for n in names]


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.storage = Storage(str(tmp_path / "store"))
        self.control = Control()
        self.now = datetime(2026, 1, 1, tzinfo=UTC)
        (tmp_path / "ws").mkdir(exist_ok=True)

    def waits(self, cap: str | None = None, spent: str = "0") -> ProgramWaits:
        journal = Journal(self.storage, layout.journal_folder("p", "r"))
        journal.load()
        return ProgramWaits(
            steps=Steps(journal),
            control=self.control,
            storage=self.storage,
            project="p",
            run="r",
            workspace=self.tmp / "ws",
            cap_usd=None if cap is None else Decimal(cap),
            spent=lambda: Decimal(spent),
            clock=lambda: self.now,
        )


def test_a_sleep_keeps_its_first_wake_time_and_completes_once_due(tmp_path: Path) -> None:
    world = World(tmp_path)
    with pytest.raises(Parked) as parked:
        asyncio.run(world.waits().sleep("sleep-1", wire.Sleep(seconds=60)))
    assert parked.value.reason == "Sleeping" and parked.value.wake_at == "2026-01-01T00:01:00Z"
    world.now += timedelta(seconds=30)
    with pytest.raises(Parked) as again:
        asyncio.run(world.waits().sleep("sleep-1", wire.Sleep(seconds=60)))
    assert again.value.wake_at == parked.value.wake_at
    world.now += timedelta(seconds=31)
    assert asyncio.run(world.waits().sleep("sleep-1", wire.Sleep(seconds=60))) is None
    states = [r.state for r in Journal(world.storage, layout.journal_folder("p", "r")).load()]
    assert states == ["Started", "Completed"]


def test_messages_are_taken_in_order_per_name_and_a_timeout_gives_timed_out(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.control.messages = [
        {"seq": 1, "name": "b", "payload": "b1"},
        {"seq": 2, "name": "a", "payload": "a1"},
        {"seq": 3, "name": "a", "payload": "true"},
    ]

    async def program(waits: ProgramWaits) -> list[Any]:
        got = [await waits.wait_for_message("message/a-1", wire.WaitForMessage("a"))]
        got.append(await waits.wait_for_message("message/b-1", wire.WaitForMessage("b")))
        got.append(await waits.wait_for_message("message/a-2", wire.WaitForMessage("a")))
        got.append(await waits.wait_for_message("message/a-3", wire.WaitForMessage("a", timeout_seconds=10)))
        return got

    with pytest.raises(Parked) as parked:
        asyncio.run(program(world.waits()))
    assert parked.value.reason == "AwaitingMessage"
    assert parked.value.waiting_for == {"message": "a", "after": 3}
    assert parked.value.wake_at == "2026-01-01T00:00:10Z"
    world.now += timedelta(seconds=11)
    # A payload is the JSON value the sender encoded (run.send("a", True) stores "true").
    assert asyncio.run(program(world.waits())) == ["a1", "b1", True, {"timedOut": True}]


def test_children_are_capped_by_what_is_left_and_gathered_when_they_end(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def program(waits: ProgramWaits) -> Any:
        await waits.spawn("spawn/one", wire.Spawn({"n": 1}, "one"))
        await waits.spawn("spawn/two", wire.Spawn({"n": 2}, "two"))
        return await waits.gather("gather-1", wire.Gather(["r-one", "r-two"]))

    with pytest.raises(Parked) as parked:
        asyncio.run(program(world.waits(cap="1.00", spent="0.20")))
    assert parked.value.reason == "AwaitingChildren"
    assert parked.value.waiting_for == {"children": ["r-one", "r-two"]}
    caps = [Decimal(args[5]) for args in world.control.spawned]
    assert caps == [Decimal("0.80"), Decimal(0)], (
        "the second child gets what the first one's commitment leaves"
    )
    assert json.loads(world.control.spawned[0][3]) == {"n": 1}
    world.control.children["r-one"].update(phase="Succeeded", costUSD="0.10")
    world.control.children["r-two"].update(phase="Failed", reason="ProgramFailed", message="boom")
    world.storage.write_bytes(layout.run_result("p", "r-one"), b'{"ok": 1}')
    results = asyncio.run(program(world.waits(cap="1.00", spent="0.20")))
    assert len(world.control.spawned) == 2, "replayed spawns create nothing"
    assert results[0]["ok"] is True and results[0]["value"] == {"ok": 1}
    assert results[1]["ok"] is False and "ProgramFailed" in results[1]["error"]["message"]


def test_send_delivers_once_with_a_key_of_its_step(tmp_path: Path) -> None:
    world = World(tmp_path)
    for _ in range(2):
        asyncio.run(world.waits().send("send-1", wire.Send("other", "ping", {"x": 1})))
    # A message is text: a payload that is not travels as its JSON, as AgentRun.send sends it.
    assert world.control.sent == [("p", "other", '{"x":1}', "r/send-1", "ping")]


def test_save_output_stores_a_workspace_file_and_refuses_paths_outside(tmp_path: Path) -> None:
    world = World(tmp_path)
    waits = world.waits()
    (tmp_path / "ws" / "report.md").write_text("# hi")
    saved = asyncio.run(waits.save_output("output/report-1", wire.SaveOutput("report", "report.md")))
    assert saved == {"name": "report", "bytes": 4}
    assert world.storage.read_bytes(layout.run_output("p", "r", "report")) == b"# hi"
    (tmp_path / "secret").write_text("no")
    (tmp_path / "ws" / "link").symlink_to(tmp_path / "secret")
    for step, path in (("a", "../secret"), ("b", "/etc/passwd"), ("c", "link"), ("d", "missing.md")):
        with pytest.raises(StepFailed):
            asyncio.run(waits.save_output(f"output/{step}-1", wire.SaveOutput(step, path)))
    with (tmp_path / "ws" / "big").open("wb") as big:
        big.truncate(MAX_OUTPUT_BYTES + 1)
    with pytest.raises(StepFailed) as failed:
        asyncio.run(waits.save_output("output/big-1", wire.SaveOutput("big", "/tmp/workspace/big")))
    assert "over" in failed.value.error["message"]


def test_the_same_key_again_is_the_same_child_and_another_input_is_refused(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def program(waits: ProgramWaits) -> Any:
        first = await waits.spawn("spawn/k", wire.Spawn({"n": 1}, "k"))
        again = await waits.spawn("spawn/k", wire.Spawn({"n": 1}, "k"))
        with pytest.raises(StepFailed) as reused:
            await waits.spawn("spawn/k", wire.Spawn({"n": 2}, "k"))
        assert "ChildKeyReused" in reused.value.error["message"]
        return first, again

    first, again = asyncio.run(program(world.waits()))
    assert first == again == {"name": "r-k"} and len(world.control.spawned) == 1
    asyncio.run(program(world.waits()))  # replayed: the same, and nothing diverges
    assert len(world.control.spawned) == 1
