"""A workspace belongs to one run: keyed by the run's uid, and swept once its run is gone.

Over the control plane's real services (fake actors): a new run named like a deleted one, or
like a run of another storage that used the same sandbox root, starts in an empty directory of
its own; the sweep at recovery and after a delete removes what runs that no longer exist left,
and spares every known run's workspace, a damaged run's, and folders that are no run's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from nodus_ray.sandbox.run_workspaces import find_entries, names_run, workspace_folder, workspace_path
from nodus_ray.sandbox.snapshots import WorkspaceSnapshots
from tests.unit.test_control_support import (
    FakeRunActor,
    Plane,
    agent_doc,
    group_doc,
    make_plane,
    run_doc,
    until,
)

UID = "0123456789abcdef0123456789abcdef"


async def _started(plane: Plane, name: str, index: int = 0) -> FakeRunActor:
    actors = await until(lambda: plane.run_actors.of(name)[index:], what=f"an actor of {name}")
    return actors[0]


def _write(workspace: Path, file: str, text: str) -> None:
    """What a command of the run would leave: a file, and the marker beside the workspace."""
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / file).write_text(text)
    WorkspaceSnapshots.marker_of(workspace).write_text("3")


async def _swept(plane: Plane) -> None:
    task = plane.services.supervisor.sweeper.sweeping
    assert task is not None, "a sweep was started"
    await task


def test_the_workspace_path_puts_the_name_first_and_the_uid_after_it() -> None:
    assert workspace_path("/srv", "demo", "r1", UID) == Path(f"/srv/demo/r1-{UID}")
    assert workspace_folder("r1", None) == "r1"  # a run stored without a uid keeps the old path
    assert names_run(f"r1-{UID}", "r1") and names_run("r1", "r1") and not names_run("r10", "r1")


def test_a_new_run_named_like_a_deleted_one_gets_a_fresh_empty_workspace(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        runs = plane.services.runs
        await plane.services.agents.apply_agent("demo", agent_doc())
        await runs.create_run("demo", run_doc("r1"))
        first = await _started(plane, "r1")
        old = Path(first.config.workspace)
        uid = (await runs.get_run("demo", "r1"))["metadata"]["uid"]
        assert old == tmp_path / "sandboxes" / "demo" / f"r1-{uid}"
        _write(old, "counter.txt", "1\n")
        first.end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.stored_phase("r1") == "Succeeded", what="the first run done")

        # A delete that did not finish: the directory is put back beside the removed run's.
        await runs.delete_run("demo", "r1")
        assert not old.exists() and not WorkspaceSnapshots.marker_of(old).exists()
        await _swept(plane)
        _write(old, "counter.txt", "1\n")

        await runs.create_run("demo", run_doc("r1"))
        second = await _started(plane, "r1", index=1)
        new = Path(second.config.workspace)
        new_uid = (await runs.get_run("demo", "r1"))["metadata"]["uid"]
        assert new_uid != uid and new == tmp_path / "sandboxes" / "demo" / f"r1-{new_uid}"
        assert not new.exists() or not any(new.iterdir()), "the new run starts on an empty workspace"
        assert not WorkspaceSnapshots.marker_of(new).exists()

        restarted = await plane.restart()
        await _swept(restarted)
        assert not old.exists() and not WorkspaceSnapshots.marker_of(old).exists(), "the orphan is swept"

    asyncio.run(scenario())


def test_a_run_of_another_storage_on_the_same_sandbox_root_leaves_nothing_to_a_new_one(
    tmp_path: Path,
) -> None:
    """``nodus down``, then ``nodus up`` on another storage: the same names, none of the files."""

    async def scenario() -> None:
        sandboxes = tmp_path / "one" / "sandboxes"
        sandboxes.mkdir(parents=True)
        (tmp_path / "two").mkdir()
        (tmp_path / "two" / "sandboxes").symlink_to(sandboxes)  # the second service's root is the first's
        before = await make_plane(tmp_path / "one")
        await before.services.agents.apply_agent("demo", agent_doc())
        await before.services.runs.create_run("demo", run_doc("r1"))
        old = Path((await _started(before, "r1")).config.workspace)
        _write(old, "counter.txt", "1\n")
        legacy = sandboxes / "demo" / "r1"  # where runs kept their workspace before uids
        _write(legacy, "counter.txt", "1\n")

        after = await make_plane(tmp_path / "two")
        await _swept(after)
        assert not old.exists() and not legacy.exists(), "workspaces of runs this storage lacks are swept"
        await after.services.agents.apply_agent("demo", agent_doc())
        await after.services.runs.create_run("demo", run_doc("r1"))
        new = Path((await _started(after, "r1")).config.workspace)
        assert new.name not in (old.name, legacy.name) and new.name.startswith("r1-")
        assert not new.exists() or not any(new.iterdir()), "the new run starts on an empty workspace"

    asyncio.run(scenario())


def test_the_sweep_removes_orphans_and_keeps_live_ones(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        runs = plane.services.runs
        await plane.services.agents.apply_agent("demo", agent_doc())
        await runs.create_run("demo", run_doc("live"))
        live = Path((await _started(plane, "live")).config.workspace)
        _write(live, "work.txt", "mine\n")
        await runs.create_run("demo", run_doc("done"))
        done_actor = await _started(plane, "done")
        done = Path(done_actor.config.workspace)
        _write(done, "report.txt", "kept for grading\n")
        done_actor.end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.stored_phase("done") == "Succeeded", what="the finished run")

        root = tmp_path / "sandboxes"
        orphan = workspace_path(root, "demo", "gone", UID)
        _write(orphan, "old.txt", "stale\n")
        (root / "demo" / f".gone-{UID}.seeding").mkdir()
        (root / "demo" / f".gone-{UID}.workspace.tmp").write_text("2")
        locked = orphan / "locked"  # a command dropped write permission on a directory
        locked.mkdir()
        (locked / "file").write_text("x")
        locked.chmod(0o500)
        _write(root / "demo" / "live", "old.txt", "a name-only folder of an earlier run\n")
        _write(workspace_path(root, "other", "far", UID), "old.txt", "another project's orphan\n")
        grading = root / ".grading" / "demo" / "g" / "r"
        grading.mkdir(parents=True)
        (root / "demo" / ".unrelated").write_text("not a workspace's")
        # A run whose document is in storage but cannot be read is spared: it may be live.
        plane.storage.write_bytes("projects/demo/agentruns/broken/run.json", b"{not json")
        broken = workspace_path(root, "demo", "broken", UID)
        _write(broken, "work.txt", "perhaps live\n")

        restarted = await plane.restart()
        await _swept(restarted)
        assert (live / "work.txt").read_text() == "mine\n" and WorkspaceSnapshots.marker_of(live).exists()
        assert (done / "report.txt").exists() and WorkspaceSnapshots.marker_of(done).exists()
        assert (broken / "work.txt").exists()
        assert grading.is_dir() and (root / "demo" / ".unrelated").exists()
        left = {entry.path.name for entry in find_entries(root)}
        assert left == {
            live.name,
            done.name,
            broken.name,
            f".{live.name}.workspace",
            f".{done.name}.workspace",
            f".{broken.name}.workspace",
        }

        # After a delete, what appeared meanwhile for a gone run is swept too; the rest stays.
        _write(orphan, "old.txt", "stale again\n")
        await restarted.services.runs.delete_run("demo", "done")
        await _swept(restarted)
        assert not orphan.exists() and not done.exists()
        assert (live / "work.txt").exists() and (broken / "work.txt").exists()

    asyncio.run(scenario())


def test_the_grader_is_sent_the_workspace_the_run_used(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        evaluation = {"environment": "nodus/arithmetic-v2@2.0.0", "tasks": 1}
        await plane.services.groups.apply_group("demo", group_doc("e", evaluation=evaluation))
        (member,) = await plane.services.runs.list_runs("demo", group="e")
        name = member["metadata"]["name"]
        plane.storage.write_bytes(f"projects/demo/agentruns/{name}/answer.txt", b"42")
        await plane.services.group_link.start_member("demo", name)
        actor = await _started(plane, name)
        actor.end({"phase": "Succeeded", "reason": "Completed", "answer": {"preview": "42"}})
        await until(lambda: plane.graders.requests, what="the case sent to the grader")
        assert plane.graders.requests[0]["localWorkspace"] == actor.config.workspace
        assert actor.config.workspace.endswith(f"{name}-{member['metadata']['uid']}")

    asyncio.run(scenario())
