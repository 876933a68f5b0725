"""``continue_as_new``: a run's journal generations, switched by the control plane, without Ray.

The program's side is the real `ProgramWaits` over a real `Journal` on local storage; the
control plane is the real one over fake run actors (`test_control_support`). What is checked:
the switch records the new input and the generation before the old journal goes, a crash at
each point neither loses the new input nor replays the old generation in the new one, the
earlier generations' cost is carried (and the supervisor's journaled cost is the sum), and the
views (steps, events) read the current generation.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from nodus._runtime import protocol as wire
from nodus.errors import Conflict
from nodus_ray.control import generations
from nodus_ray.durable.journal import Journal
from nodus_ray.durable.steps import Steps
from nodus_ray.runtime.program.server import ContinuedAsNew, ProgramServer
from nodus_ray.runtime.program.waits import ProgramWaits
from nodus_ray.runtime.run_actor import RunConfig
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage
from tests.unit.test_control_support import Plane, make_plane, run_doc, until
from tests.unit.test_wake_timers import python_agent


class Crash(Exception):
    """The actor died here (its call to the control plane never landed)."""


class PlaneControl:
    """The actor's control-plane client, straight to the plane's services (``crash``: it dies first)."""

    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        self.crash = False
        self.calls: list[tuple[Any, ...]] = []
        self.asked_after: list[int] = []

    async def next_message(
        self, project: str, name: str, after_seq: int, message_name: str | None = None
    ) -> dict[str, Any] | None:
        self.asked_after.append(after_seq)
        return {"seq": after_seq + 1, "name": message_name, "payload": f"m{after_seq + 1}"}

    async def continue_as_new(
        self,
        project: str,
        name: str,
        attempt: int,
        generation: int,
        input_text: str,
        read: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        self.calls.append((attempt, generation, input_text))
        if self.crash:
            raise Crash
        return await self.plane.services.generations.continue_as_new(
            project, name, attempt, generation, input_text, read
        )


def journal_of(storage: Storage, config: RunConfig) -> Journal:
    """The journal the actor of ``config`` opens (`RunActor._generation`)."""
    journal = Journal(
        storage,
        layout.journal_generation_folder("demo", "r1", config.generation),
        first_seq=config.journal_first_seq,
    )
    journal.load()
    return journal


def waits_of(plane: Plane, control: PlaneControl, config: RunConfig, tmp_path: Path) -> ProgramWaits:
    return ProgramWaits(
        steps=Steps(journal_of(plane.storage, config)),
        control=control,  # type: ignore[arg-type]  # only messages and continue_as_new are asked
        storage=plane.storage,
        project="demo",
        run="r1",
        workspace=tmp_path,
        attempt=config.attempt,
        generation=config.generation,
        read_before=config.messages_read,
    )


async def program(waits: ProgramWaits, computed: Any) -> None:
    """The program of the test: one step (replayed), a message, then ``continue_as_new(computed)``."""
    begun = await waits.steps.begin("ask-1", "step", effect="pure")
    assert begun.recorded  # written before, with its cost
    assert await waits.wait_for_message("message/user-1", wire.WaitForMessage("user")) == "m1"
    await waits.continue_as_new("continue-as-new", wire.ContinueAsNew(input=computed))


def test_journal_of_a_later_generation_goes_on_from_the_earlier_ones_seqs(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path / "store"))
    journal = Journal(storage, layout.journal_generation_folder("p", "r", 1), first_seq=5)
    assert journal.load() == []
    assert journal.append("a-1", "step", "Completed").seq == 5
    again = Journal(storage, layout.journal_generation_folder("p", "r", 1), first_seq=5)
    again.load()
    assert again.append("b-1", "step", "Completed").seq == 6
    assert layout.journal_generation_folder("p", "r", 0) == layout.journal_folder("p", "r")


def test_a_crash_at_each_point_of_the_switch_loses_no_input_and_replays_no_old_step(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.runs.create_run("demo", run_doc("r1", agent="py", input="first"))
        (first,) = await until(lambda: plane.run_actors.of("r1"), what="the first actor")
        assert (first.config.generation, first.config.generation_input) == (0, None)
        old = journal_of(plane.storage, first.config)
        await asyncio.to_thread(old.append, "ask-1", "step", "Completed", {"result": 1}, cost_usd="0.10")
        control = PlaneControl(plane)

        # 1. The generation's last record is written, then the actor dies before the plane hears.
        control.crash = True
        with pytest.raises(Crash):
            await program(waits_of(plane, control, first.config, tmp_path), {"n": 2})
        records = await asyncio.to_thread(journal_of(plane.storage, first.config).load)
        assert [(r.step_id, r.kind, r.state) for r in records][-1] == (
            "continue-as-new",
            "continue-as-new",
            "Completed",
        )
        plane.run_actors.kill(first)
        second = (await until(lambda: plane.run_actors.of("r1")[1:], what="a second actor"))[0]
        # Nothing switched: the old generation replays, with its own input.
        assert (second.config.generation, second.config.generation_input) == (0, None)

        # 2. Its replay reaches the recorded request: the journal's input is the new one, not
        # what the program computes this time.
        control.crash = False
        with pytest.raises(ContinuedAsNew) as switched:
            await program(waits_of(plane, control, second.config, tmp_path), {"n": 999})
        assert switched.value.input_text == '{"n":2}'
        assert (switched.value.generation, switched.value.first_seq) == (1, 4)
        assert switched.value.read == {"user": 1}
        assert Decimal(switched.value.prior_usd) == Decimal("0.10")
        run = await plane.services.runs.get_run("demo", "r1")
        assert run["status"]["generation"] == 1 and Decimal(run["status"]["cost"]["priorUSD"]) == Decimal(
            "0.10"
        )
        record = plane.storage.read_json(layout.run_generation("demo", "r1", 1))
        assert record["input"] == '{"n":2}' and record["firstSeq"] == 4
        assert plane.storage.list_dir(layout.journal_folder("demo", "r1")) == []  # bounded history

        # 3. Asked again (the answer was lost): the same switch, the cost counted once.
        again = await plane.services.generations.continue_as_new(
            "demo", "r1", second.config.attempt, 0, '{"n":2}'
        )
        assert again == {
            "generation": 1,
            "firstSeq": 4,
            "priorUSD": switched.value.prior_usd,
            "priorSandboxUSD": switched.value.prior_sandbox_usd,
        }
        with pytest.raises(Conflict) as zombie:  # the first actor, come back
            await plane.services.generations.continue_as_new("demo", "r1", first.config.attempt, 1, "x")
        assert zombie.value.code == "StaleAttempt"
        with pytest.raises(Conflict) as other:
            await plane.services.generations.continue_as_new("demo", "r1", second.config.attempt, 0, "other")
        assert other.value.code == "GenerationMismatch"

        # 4. The actor dies after the switch: the next one runs generation 1 with the new input,
        # on an empty journal whose seqs go on from the old one's.
        plane.run_actors.kill(second)
        third = (await until(lambda: plane.run_actors.of("r1")[2:], what="a third actor"))[0]
        config = third.config
        assert (config.generation, config.generation_input, config.journal_first_seq) == (1, '{"n":2}', 4)
        assert Decimal(config.prior_cost_usd) == Decimal("0.10")
        assert journal_of(plane.storage, config).records == []
        # The message the old generation took is not taken again: the new one reads after it.
        assert config.messages_read == {"user": 1}
        control.asked_after.clear()
        later = waits_of(plane, control, config, tmp_path)
        assert await later.wait_for_message("message/user-1", wire.WaitForMessage("user")) == "m2"
        assert control.asked_after == [1]
        new = journal_of(plane.storage, config)
        assert [(r.seq, r.step_id) for r in new.records] == [(4, "message/user-1"), (5, "message/user-1")]
        added = await asyncio.to_thread(new.append, "reply-1", "step", "Completed", {}, cost_usd="0.05")
        assert added.seq == 6

        # The views read the current generation; the journaled cost is the whole run's.
        steps = await plane.services.runs.run_steps("demo", "r1")
        assert [step["id"] for step in steps] == ["message/user-1", "reply-1"]
        events = await plane.services.runs.run_events("demo", "r1", 5)
        assert [record["seq"] for record in events["records"]] == [5, 6]
        cost = await asyncio.to_thread(plane.services.supervisor._journaled_cost, ("demo", "r1"))
        assert cost == Decimal("0.15")

    asyncio.run(scenario())


def test_a_switch_that_stopped_before_its_deletes_is_cleaned_by_the_next_actor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.runs.create_run("demo", run_doc("r1", agent="py", input="first"))
        (first,) = await until(lambda: plane.run_actors.of("r1"), what="the first actor")
        old = journal_of(plane.storage, first.config)
        await asyncio.to_thread(old.append, "ask-1", "step", "Completed", {"result": 1}, cost_usd="0.10")

        def stopped(*args: Any) -> None:
            raise Crash

        monkeypatch.setattr(generations, "delete_older_generations", stopped)
        with pytest.raises(ContinuedAsNew):
            await program(waits_of(plane, PlaneControl(plane), first.config, tmp_path), "second")
        assert plane.storage.list_dir(layout.journal_folder("demo", "r1"))  # still there
        monkeypatch.undo()
        plane.run_actors.kill(first)
        second = (await until(lambda: plane.run_actors.of("r1")[1:], what="a second actor"))[0]
        assert (second.config.generation, second.config.generation_input) == (1, "second")
        assert plane.storage.list_dir(layout.journal_folder("demo", "r1")) == []
        # A finished run continues no more.
        second.end({"phase": "Succeeded", "reason": "Completed", "cost": {"totalUSD": "0.10"}})
        await until(lambda: plane.phase("r1") == "Succeeded", what="the run done")
        with pytest.raises(Conflict) as finished:
            await plane.services.generations.continue_as_new("demo", "r1", second.config.attempt, 1, "x")
        assert finished.value.code == "RunFinished"

    asyncio.run(scenario())


def test_the_server_answers_continue_as_new_and_the_program_ends_with_the_switch(tmp_path: Path) -> None:
    class Ops:
        async def continue_as_new(self, step_id: str, request: wire.ContinueAsNew) -> Any:
            assert step_id == "continue-as-new"
            raise ContinuedAsNew(3, str(request.input), 17, "0.25")

    async def scenario() -> None:
        journal = Journal(Storage(str(tmp_path / "store")), layout.journal_folder("p", "r"))
        journal.load()
        server = ProgramServer(Steps(journal), Ops(), {"input": 1})  # type: ignore[arg-type]
        await server.start(tmp_path / "s.sock")
        try:
            assert (await server.dispatch(wire.Hello())) is not None
            reply = await server.dispatch(wire.ContinueAsNew(input="next"))
            assert reply is not None and reply.outcome == wire.Outcome.OK
            with pytest.raises(ContinuedAsNew) as ended:
                await server.finished()
            assert (ended.value.generation, ended.value.input_text, ended.value.first_seq) == (3, "next", 17)
        finally:
            await server.close()

    asyncio.run(scenario())
