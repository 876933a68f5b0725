"""ForkService over real storage (`control.forks`): what a fork's first actor finds, and refusals."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from nodus.errors import Conflict, Invalid, NotFound
from nodus_ray.control.forks import ForkRequest, ForkService, fork_name, stored_states
from nodus_ray.durable.journal import Journal
from nodus_ray.sandbox.snapshots import WorkspaceSnapshots
from nodus_ray.store import layout
from tests.unit.test_control_support import Plane, agent_doc, make_plane, run_doc, until


def _tree(plane: Plane, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix``, by key: what "untouched" compares."""
    found: dict[str, bytes] = {}
    for entry in plane.storage.list_dir(prefix):
        key = f"{prefix}/{entry}"
        try:
            found[key] = plane.storage.read_bytes(key)
        except (IsADirectoryError, FileNotFoundError, OSError):
            found.update(_tree(plane, key))
    return found


async def _finished_run(plane: Plane, tmp_path: Path, name: str = "r1", **spec: Any) -> dict[str, int]:
    """A run that ran three commands (each adding a file) and succeeded, as its actor leaves it:
    its journal, a workspace snapshot after each command (with history). The commands' seqs."""
    await plane.services.agents.apply_agent("demo", agent_doc())
    await plane.services.runs.create_run("demo", run_doc(name, **spec))
    (actor,) = await until(lambda: plane.run_actors.of(name), what="the run's actor")
    journal = Journal(plane.storage, layout.journal_folder("demo", name))
    prefix = layout.run_prefix("demo", name)
    workspace = WorkspaceSnapshots(plane.storage, prefix, tmp_path / "ws" / name, history=True)
    workspace.workspace.mkdir(parents=True)
    seqs: dict[str, int] = {}

    def write() -> None:
        journal.load()
        journal.append("sandbox", "sandbox", "Completed", {"result": {"backend": "bubblewrap"}})
        journal.append("message-0", "message", "Completed", {"role": "user", "content": "hello"})
        journal.append(
            "turn-1/route", "route", "Completed", {"result": {"billedUSD": "0.001"}}, cost_usd="0.001"
        )
        journal.append("turn-1/model-1", "model", "Started", {})
        journal.append(
            "turn-1/model-1", "model", "Completed", {"result": {"billedUSD": "0.02"}}, cost_usd="0.02"
        )
        for position in (1, 2, 3):
            step = f"turn-1/command-1-{position}"
            started = journal.append(step, "command", "Started", {"command": f"touch f{position}"})
            (workspace.workspace / f"f{position}.txt").write_text(f"file {position}\n")
            workspace.after_command(started.seq)
            journal.append(step, "command", "Completed", {"result": {"exit_code": 0, "sandboxUSD": "0.001"}})
            seqs[step] = started.seq
        journal.append("turn-1/model-2", "model", "Started", {})
        journal.append(
            "turn-1/model-2", "model", "Completed", {"result": {"billedUSD": "0.02"}}, cost_usd="0.02"
        )

    await asyncio.to_thread(write)
    actor.end({"phase": "Succeeded", "reason": "Completed"})
    await until(lambda: plane.stored_phase(name) == "Succeeded", what="the run finished")
    return seqs


def test_a_fork_gets_the_journal_before_the_step_and_the_workspace_after_the_last_command_kept(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        seqs = await _finished_run(plane, tmp_path)
        original = _tree(plane, layout.run_prefix("demo", "r1"))
        assert len(stored_states(plane.storage, layout.run_prefix("demo", "r1"))) == 3, "history kept"
        forks = ForkService(plane.services.registry, plane.services.runs)
        run = await forks.fork("demo", "r1", ForkRequest(at="turn-1/command-1-3", name="r1-b"))
        assert run["metadata"]["name"] == "r1-b" and run["spec"] == {
            "agent": "helper",
            "input": "hello",
            "keepAlive": False,
        }
        assert run["status"]["forkedFrom"] == {
            "run": "r1",
            "uid": plane.services.registry.runs[("demo", "r1")]["metadata"]["uid"],
            "step": "turn-1/command-1-3",
            "stepNumber": 6,
            "seq": seqs["turn-1/command-1-3"],
        }
        records = await asyncio.to_thread(Journal(plane.storage, layout.journal_folder("demo", "r1-b")).load)
        assert [r.seq for r in records] == list(range(seqs["turn-1/command-1-3"]))
        assert {r.step_id for r in records if r.kind == "command"} == {
            "turn-1/command-1-1",
            "turn-1/command-1-2",
        }
        assert sum(float(r.cost_usd) for r in records) == 0, "the original paid for them"
        fork_prefix = layout.run_prefix("demo", "r1-b")
        assert stored_states(plane.storage, fork_prefix) == {seqs["turn-1/command-1-2"]: "manifest"}
        restored = WorkspaceSnapshots(plane.storage, fork_prefix, tmp_path / "ws" / "r1-b")
        assert restored.ensure((seqs["turn-1/command-1-2"],)) == "restored"
        assert sorted(p.name for p in restored.workspace.iterdir()) == ["f1.txt", "f2.txt"]
        await until(lambda: plane.run_actors.of("r1-b"), what="the fork's actor")
        assert _tree(plane, layout.run_prefix("demo", "r1")) == original, "the original is untouched"
        # Deleting the original leaves the fork whole: nothing is shared.
        await plane.services.runs.delete_run("demo", "r1")
        restored.unpack(seqs["turn-1/command-1-2"], tmp_path / "again")
        assert sorted(p.name for p in (tmp_path / "again").iterdir()) == ["f1.txt", "f2.txt"]

    asyncio.run(scenario())


def test_a_fork_before_any_command_starts_on_a_new_workspace_and_names_itself(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await _finished_run(plane, tmp_path)
        forks = ForkService(plane.services.registry, plane.services.runs)
        first = await forks.fork("demo", "r1", ForkRequest(at="2", input="say hi"))
        second = await forks.fork("demo", "r1", ForkRequest(at="3"))
        assert (first["metadata"]["name"], second["metadata"]["name"]) == ("r1-fork-1", "r1-fork-2")
        assert first["spec"]["input"] == "say hi" and first["status"]["forkedFrom"]["input"] == "prompt"
        assert second["spec"]["input"] == "hello"
        assert stored_states(plane.storage, layout.run_prefix("demo", "r1-fork-2")) == {}
        kept = await asyncio.to_thread(
            Journal(plane.storage, layout.journal_folder("demo", "r1-fork-1")).load
        )
        assert kept == [], "a new prompt keeps no step"

    asyncio.run(scenario())


def test_a_keep_alive_fork_with_input_reads_it_as_the_next_message(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("chat", keepAlive=True))
        (actor,) = await until(lambda: plane.run_actors.of("chat"), what="the run's actor")
        for text in ("first", "second"):
            await plane.services.messages.send_message("demo", "chat", text)
        journal = Journal(plane.storage, layout.journal_folder("demo", "chat"))

        def write() -> None:
            journal.load()
            journal.append("sandbox", "sandbox", "Completed", {"result": {}})
            journal.append("turn-1/route", "route", "Completed", {"result": {}})
            journal.append("turn-2/message", "inbox", "Completed", {"result": {"seq": 1, "payload": "first"}})
            journal.append("turn-2/route", "route", "Completed", {"result": {}})
            journal.append(
                "turn-3/message", "inbox", "Completed", {"result": {"seq": 2, "payload": "second"}}
            )

        await asyncio.to_thread(write)
        assert actor is not None  # still going on: a fork reads what its journal holds already
        forks = ForkService(plane.services.registry, plane.services.runs)
        run = await forks.fork("demo", "chat", ForkRequest(at="turn-3/message", name="chat-b", input="other"))
        assert run["status"]["messages"]["received"] == 2
        folder = layout.messages_folder("demo", "chat-b")
        inbox = [plane.storage.read_json(f"{folder}/{entry}") for entry in plane.storage.list_dir(folder)]
        assert [(m["seq"], m["payload"]) for m in inbox] == [(1, "first"), (2, "other")]
        same = await forks.fork("demo", "chat", ForkRequest(at="turn-3/message", name="chat-c"))
        folder = layout.messages_folder("demo", "chat-c")
        assert len(plane.storage.list_dir(folder)) == 2 and same["status"]["forkedFrom"]["seq"] == 4

    asyncio.run(scenario())


def test_bad_forks_are_refused_with_one_clear_error_and_leave_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await _finished_run(plane, tmp_path)
        forks = ForkService(plane.services.registry, plane.services.runs)
        with pytest.raises(NotFound):
            await forks.fork("demo", "nope", ForkRequest(at="1"))
        with pytest.raises(NotFound):
            await forks.fork("other", "r1", ForkRequest(at="1"))
        with pytest.raises(Invalid) as bad_name:
            await forks.fork("demo", "r1", ForkRequest(at="1", name="Bad_Name"))
        assert bad_name.value.details["field"] == "name"
        with pytest.raises(Invalid, match="step 42 does not exist: the run has 7 steps") as missing:
            await forks.fork("demo", "r1", ForkRequest(at="42"))
        assert missing.value.details["field"] == "at"
        with pytest.raises(Invalid, match="--input replaces a user message"):
            await forks.fork("demo", "r1", ForkRequest(at="5", input="x"))
        with pytest.raises(Conflict, match="already exists"):
            await forks.fork("demo", "r1", ForkRequest(at="2", name="r1"))
        # The workspace a fork needs is gone: refused, and the fork's name is not taken.
        plane.storage.delete_tree(layout.workspace_folder(layout.run_prefix("demo", "r1")))
        with pytest.raises(Conflict) as gone:
            await forks.fork("demo", "r1", ForkRequest(at="7", name="late"))
        assert gone.value.code == "WorkspaceNotStored"
        assert ("demo", "late") not in plane.services.registry.runs
        assert plane.storage.list_dir(layout.run_prefix("demo", "late")) == []

    asyncio.run(scenario())


def test_a_fork_name_fits_a_dns_label() -> None:
    assert fork_name("a", set()) == "a-fork-1"
    assert fork_name("a", {"a-fork-1"}) == "a-fork-2"
    long = "x" * 63
    assert len(fork_name(long, set())) == 63
