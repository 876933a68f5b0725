"""Retention without Ray: the journal skeleton, its crash-safe rewrite, and the sweeper over runs.

Time is never waited for: the sweep is asked about a moment (``sweep(now=...)``) after the
retention, so each test says exactly when "later" is.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from nodus.errors import Conflict, PayloadExpired
from nodus_ray.control.retention import RetentionSweeper
from nodus_ray.control.retention_policy import RetentionPolicy, parse_retention
from nodus_ray.durable.journal import Journal
from nodus_ray.durable.skeleton import EXPIRED, read_skeleton, rewrite_skeleton, skeleton_payload
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage
from nodus_ray.store.timestamps import parse_timestamp
from tests.unit.test_control_support import Plane, agent_doc, make_plane, run_doc, until

SECRET = "the-user-said-this-in-private"


def _fill(journal: Journal) -> None:
    """A small run's journal: a message, a model call, a command (with output), an answer; each
    record written by a writer that loaded the journal first (as a new actor does), so each is
    an object of its own on a local disk (a log per writer) as on S3."""
    real_append = journal.append

    def append(*args: Any, **kwargs: Any) -> Any:
        journal.load()
        return real_append(*args, **kwargs)

    journal.append = append  # type: ignore[method-assign]
    journal.append("m/1", "message", "Completed", {"role": "user", "content": SECRET})
    journal.append("t1/model", "model", "Started", {"summary": f"asking about {SECRET}"})
    journal.append(
        "t1/model",
        "model",
        "Completed",
        {
            "summary": "sonnet answered",
            "result": {"text": SECRET, "model": "claude-sonnet", "inputTokens": 12, "outputTokens": 7},
        },
        cost_usd="0.0012",
    )
    journal.append("t1/cmd", "command", "Started", {"command": f"echo {SECRET}"})
    journal.append(
        "t1/cmd",
        "command",
        "Completed",
        {"result": {"stdout": SECRET, "exitCode": 0, "cpuSeconds": 0.01, "sandboxUSD": "0.000001"}},
    )
    journal.append("answer", "answer", "Completed", {"summary": SECRET, "text": SECRET})


def _objects(storage: Storage, prefix: str) -> list[str]:
    return sorted(storage.list_dir(prefix))


# -- the policy -----------------------------------------------------------------------------


def test_a_retention_is_a_duration_with_days_and_per_project_overrides() -> None:
    assert parse_retention("30d") == timedelta(days=30)
    assert parse_retention("1d12h") == timedelta(days=1, hours=12)
    assert parse_retention("2s") == timedelta(seconds=2)
    policy = RetentionPolicy.parse("30d, audit=365d,scratch=1h", "NODUS_PAYLOAD_RETENTION")
    assert policy.for_project("audit") == timedelta(days=365)
    assert policy.for_project("scratch") == timedelta(hours=1)
    assert policy.for_project("default") == timedelta(days=30)
    for bad in ("0s", "soon", "30d,1d", "audit=1d", "30d,Not_A_Label=1d", "30d,x=-1s"):
        with pytest.raises(ValueError, match="NODUS_PAYLOAD_RETENTION"):
            RetentionPolicy.parse(bad, "NODUS_PAYLOAD_RETENTION")


def test_the_settings_refuse_a_bad_retention_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from nodus_ray.settings import ServerSettings

    monkeypatch.setenv("NODUS_WORKSPACE_RETENTION", "tomorrow")
    with pytest.raises(ValueError, match="NODUS_WORKSPACE_RETENTION"):
        ServerSettings.from_env()
    monkeypatch.setenv("NODUS_WORKSPACE_RETENTION", "2h,retention-it=1s")
    monkeypatch.setenv("NODUS_PAYLOAD_RETENTION", "")
    settings = ServerSettings.from_env()
    assert (settings.payload_retention, settings.workspace_retention) == ("30d", "2h,retention-it=1s")


# -- the skeleton ---------------------------------------------------------------------------


def test_the_skeleton_keeps_ids_kinds_states_times_attempts_and_costs_and_drops_values(
    tmp_path: Path,
) -> None:
    storage = Storage(str(tmp_path))
    journal = Journal(storage, "run/journal")
    _fill(journal)
    before = journal.load()
    deleted = rewrite_skeleton(storage, "run/journal")
    assert deleted == len(before)
    assert _objects(storage, "run/journal") == ["000000000000-000000000005.skeleton.arrow"]
    after = Journal(storage, "run/journal").load()
    assert [(r.seq, r.step_id, r.kind, r.state, r.attempt, r.cost_usd, r.at) for r in after] == [
        (r.seq, r.step_id, r.kind, r.state, r.attempt, r.cost_usd, r.at) for r in before
    ]
    assert all(r.payload[EXPIRED] is True for r in after)
    assert SECRET not in repr([r.payload for r in after])
    model = after[2].payload
    assert model["result"] == {"model": "claude-sonnet", "inputTokens": 12, "outputTokens": 7}
    command = after[4].payload
    assert command["result"] == {"exitCode": 0, "cpuSeconds": 0.01, "sandboxUSD": "0.000001"}
    assert skeleton_payload(None) == {EXPIRED: True}
    assert skeleton_payload("text") == {EXPIRED: True}
    assert rewrite_skeleton(storage, "run/journal") == 0  # again: nothing left to do


def test_a_crash_mid_rewrite_leaves_a_readable_journal_and_a_second_sweep_finishes(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path))
    journal = Journal(storage, "run/journal")
    _fill(journal)
    records = journal.load()

    class Crash(Exception):
        pass

    # Before the skeleton is written: the journal is as it was.
    real_create = storage.create_bytes

    def no_create(key: str, data: bytes) -> None:
        raise Crash(key)

    storage.create_bytes = no_create  # type: ignore[method-assign]
    with pytest.raises(Crash):
        rewrite_skeleton(storage, "run/journal")
    storage.create_bytes = real_create  # type: ignore[method-assign]
    assert [r.payload for r in Journal(storage, "run/journal").load()] == [r.payload for r in records]

    # After the skeleton, two deletes in: the skeleton is read, never the leftovers.
    real_delete = storage.delete
    calls: list[str] = []

    def delete_twice(key: str) -> None:
        if len(calls) == 2:
            raise Crash(key)
        calls.append(key)
        real_delete(key)

    storage.delete = delete_twice  # type: ignore[method-assign]
    with pytest.raises(Crash):
        rewrite_skeleton(storage, "run/journal")
    storage.delete = real_delete  # type: ignore[method-assign]
    left = _objects(storage, "run/journal")
    assert len(left) == 1 + len(records) - 2
    reread = Journal(storage, "run/journal").load()
    assert [r.seq for r in reread] == [r.seq for r in records]
    assert SECRET not in repr([r.payload for r in reread])

    assert rewrite_skeleton(storage, "run/journal") == len(records) - 2
    assert _objects(storage, "run/journal") == ["000000000000-000000000005.skeleton.arrow"]
    assert [r.seq for r in read_skeleton(storage, "run/journal")] == [r.seq for r in records]


def test_a_compacted_journal_becomes_one_skeleton_too(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path))
    journal = Journal(storage, "run/journal")
    for index in range(10):
        journal.append(f"s{index}", "step", "Completed", {"result": SECRET, "n": index})
    assert journal.compact() > 0
    rewrite_skeleton(storage, "run/journal")
    assert _objects(storage, "run/journal") == ["000000000000-000000000009.skeleton.arrow"]
    assert [r.payload["n"] for r in Journal(storage, "run/journal").load()] == list(range(10))


# -- the sweeper over runs --------------------------------------------------------------------


async def _finished_run(plane: Plane, name: str, phase: str = "Succeeded", **spec: Any) -> dict[str, Any]:
    """A run whose actor wrote a journal, an answer file and a workspace, then ended ``phase``."""
    await plane.services.runs.create_run("demo", run_doc(name, input=SECRET, **spec))
    (actor,) = await until(lambda: plane.run_actors.of(name), what=f"{name}'s actor")
    await until(lambda: plane.phase(name) == "Running", what=f"{name} running")
    storage = plane.storage
    _fill(Journal(storage, layout.journal_folder("demo", name)))
    storage.write_bytes(layout.run_answer("demo", name), SECRET.encode())
    storage.write_json(layout.message("demo", name, 1), {"seq": 1, "payload": SECRET})
    storage.write_bytes(layout.run_output("demo", name, "report.txt"), SECRET.encode())
    prefix = layout.run_prefix("demo", name)
    storage.write_bytes(layout.workspace_snapshot(prefix, 4), b"tar")  # as written before manifests
    storage.write_json(layout.workspace_manifest(prefix, 5), {"version": 1, "entries": []})
    storage.write_bytes(layout.workspace_blob(prefix, "ab" * 32), SECRET.encode())
    workspace = Path(plane.services.supervisor.workspace("demo", name))
    workspace.mkdir(parents=True)
    (workspace / "notes.txt").write_text(SECRET)
    turn = {"index": 1, "prompt": SECRET, "inputTokens": 12, "outputTokens": 7, "costUSD": "0.0012"}
    actor.end(
        {
            "phase": phase,
            "reason": "Completed" if phase == "Succeeded" else "CommandFailed",
            "turns": [turn],
            "answer": {"preview": SECRET[:10], "bytes": len(SECRET), "truncated": False},
            "cost": {"totalUSD": "0.0012"},
        }
    )
    await until(lambda: plane.phase(name) == phase, what=f"{name} {phase}")
    return await plane.services.runs.get_run("demo", name)


def _later(run: dict[str, Any], by: timedelta) -> datetime:
    return parse_timestamp(run["status"]["finishedAt"]) + by


def _sweeper(plane: Plane, payloads: str = "30d", workspaces: str = "24h") -> RetentionSweeper:
    from dataclasses import replace

    settings = replace(plane.settings, payload_retention=payloads, workspace_retention=workspaces)
    return RetentionSweeper(plane.services.registry, settings, plane.services.evaluations.forget)


def test_the_workspace_goes_first_then_the_payloads_and_the_run_and_its_totals_stay(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        run = await _finished_run(plane, "r1")
        sweeper = _sweeper(plane)
        storage, prefix = plane.storage, layout.run_prefix("demo", "r1")
        workspace = Path(plane.services.supervisor.workspace("demo", "r1"))

        assert (await sweeper.sweep(_later(run, timedelta(hours=23)))).workspaces == []
        assert storage.exists(layout.workspace_blob(prefix, "ab" * 32)), "kept until its time is up"
        report = await sweeper.sweep(_later(run, timedelta(hours=25)))
        assert report.workspaces == [("demo", "r1")] and report.payloads == []
        assert not workspace.exists() and storage.list_dir(layout.workspace_folder(prefix)) == []
        assert run["status"]["sandbox"]["workspaceDeletedAt"]
        assert (await plane.services.runs.run_answer("demo", "r1"))["answer"] == SECRET  # kept still

        report = await sweeper.sweep(_later(run, timedelta(days=31)))
        assert report.payloads == [("demo", "r1")]
        stored = storage.read_json(layout.run_document("demo", "r1"))
        status = stored["status"]
        assert status["payloadsExpiredAt"] and status["retention"] == {
            "workspace": "Deleted",
            "payloads": "Expired",
        }
        assert SECRET not in repr(stored)
        assert stored["spec"]["input"] == "" and status["answer"]["bytes"] == len(SECRET)
        assert status["phase"] == "Succeeded" and status["cost"]["totalUSD"] == "0.0012"
        assert status["turns"][0]["inputTokens"] == 12 and status["turns"][0]["costUSD"] == "0.0012"
        for read in (
            plane.services.runs.run_answer("demo", "r1"),
            plane.services.messages.next_message("demo", "r1", 0),
        ):
            with pytest.raises(PayloadExpired) as expired:
                await read
            assert expired.value.status == 410 and expired.value.code == "PayloadExpired"
        steps = await plane.services.runs.run_steps("demo", "r1")
        assert [(s["id"], s["kind"], s["state"]) for s in steps] == [
            ("t1/model", "model", "Completed"),
            ("t1/cmd", "command", "Completed"),
            ("answer", "answer", "Completed"),
        ]
        assert steps[0]["costUSD"] == "0.0012" and steps[0]["attempts"] == 1 and steps[0]["finishedAt"]
        assert SECRET not in repr(steps)
        for folder in ("messages", "outputs"):
            assert storage.list_dir(f"{prefix}/{folder}") == []
        assert not storage.exists(layout.run_answer("demo", "r1"))
        assert (await sweeper.sweep(_later(run, timedelta(days=40)))).payloads == []  # done once

    asyncio.run(scenario())


def test_unfinished_runs_are_never_touched(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("running", input=SECRET))
        await plane.services.runs.create_run("demo", run_doc("alive", input=SECRET, keepAlive=True))
        await until(lambda: len(plane.run_actors.started) == 2, what="both actors")
        plane.run_actors.of("alive")[0].end(
            {"phase": "Waiting", "reason": "AwaitingMessage", "messages": {"read": 0}}
        )
        await until(lambda: plane.phase("alive") == "Waiting", what="the keep-alive run waiting")
        sweeper = _sweeper(plane, payloads="1s", workspaces="1s")
        assert sweeper.next_due() is None
        report = await sweeper.sweep(datetime.now(UTC) + timedelta(days=400))
        assert report.payloads == [] and report.workspaces == []
        for name in ("running", "alive"):
            stored = plane.storage.read_json(layout.run_document("demo", name))
            assert stored["spec"]["input"] == SECRET and stored["status"].get("payloadsExpiredAt") is None

    asyncio.run(scenario())


def test_a_failed_run_is_not_retried_once_its_workspace_or_payloads_are_gone(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        run = await _finished_run(plane, "f1", phase="Failed")
        sweeper = _sweeper(plane)
        run["status"]["retention"] = {"workspace": "Deleting"}  # a sweep that stopped midway
        with pytest.raises(Conflict) as midway:
            await plane.services.controls.retry_run("demo", "f1")
        assert midway.value.code == "WorkspaceDeleted"
        run["status"]["retention"] = {}
        await sweeper.sweep(_later(run, timedelta(hours=25)))
        with pytest.raises(Conflict) as refused:
            await plane.services.controls.retry_run("demo", "f1")
        assert refused.value.code == "WorkspaceDeleted"
        assert refused.value.details["field"] == "status.sandbox.workspaceDeletedAt"
        assert plane.phase("f1") == "Failed"  # nothing changed
        await sweeper.sweep(_later(run, timedelta(days=31)))
        with pytest.raises(PayloadExpired):
            await plane.services.controls.retry_run("demo", "f1")

    asyncio.run(scenario())


def test_a_retried_run_is_running_again_and_its_earlier_end_is_not_swept(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        run = await _finished_run(plane, "f2", phase="Failed")
        await plane.services.controls.retry_run("demo", "f2")
        assert plane.phase("f2") == "Running" and run["status"]["finishedAt"] is None
        report = await _sweeper(plane).sweep(datetime.now(UTC) + timedelta(days=400))
        assert report.payloads == [] and report.workspaces == []

    asyncio.run(scenario())


def test_a_sweep_stopped_midway_is_finished_by_the_next_control_plane(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        run = await _finished_run(plane, "r2")
        sweeper = _sweeper(plane)

        def crash(*_: Any) -> None:
            raise RuntimeError("the control plane stopped here")

        import nodus_ray.control.retention as retention

        real = retention.expire_run_files
        retention.expire_run_files = crash  # type: ignore[assignment]
        try:
            with pytest.raises(RuntimeError):
                await sweeper.expire_payloads(("demo", "r2"), _later(run, timedelta(days=31)))
        finally:
            retention.expire_run_files = real  # type: ignore[assignment]
        stored = plane.storage.read_json(layout.run_document("demo", "r2"))
        assert stored["status"]["retention"]["payloads"] == "Expiring"  # marked, files still there
        with pytest.raises(PayloadExpired):
            await plane.services.runs.run_answer("demo", "r2")

        restarted = await plane.restart()
        again = _sweeper(restarted)
        report = await again.sweep(_later(run, timedelta(days=31)))
        assert ("demo", "r2") in report.payloads
        stored = restarted.storage.read_json(layout.run_document("demo", "r2"))
        assert stored["status"]["retention"]["payloads"] == "Expired"
        assert not restarted.storage.exists(layout.run_answer("demo", "r2"))
        assert SECRET not in repr(Journal(restarted.storage, layout.journal_folder("demo", "r2")).load())

    asyncio.run(scenario())


def test_the_timer_is_armed_for_the_earliest_due_time_not_a_poll(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        sweeper = _sweeper(plane, payloads="30d,demo=2h", workspaces="24h,demo=30m")
        sweeper.start()
        await until(lambda: sweeper.sweeping is not None and sweeper.sweeping.done(), what="the first sweep")
        assert sweeper.armed_for is not None  # nothing due: the hourly rescan at the latest
        run = await _finished_run(plane, "r3")
        due = _later(run, timedelta(minutes=30))
        await until(lambda: sweeper.armed_for == due, what="the timer armed for it when it finished")
        assert sweeper.next_due() == _later(run, timedelta(minutes=30))
        sweeper.stop()

    asyncio.run(scenario())


def test_outputs_logs_and_an_evaluations_case_records_answer_payload_expired(tmp_path: Path) -> None:
    from nodus_ray.control.run_files import RunFiles

    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        run = await _finished_run(plane, "r4")
        files = RunFiles(plane.services.registry)
        assert await files.run_output("demo", "r4", "report.txt") == SECRET.encode()
        await _sweeper(plane).sweep(_later(run, timedelta(days=31)))
        for read in (
            files.run_outputs("demo", "r4"),
            files.run_output("demo", "r4", "report.txt"),
            files.run_logs("demo", "r4"),
        ):
            with pytest.raises(PayloadExpired):
                await read

        # An evaluation group that ended: its cases keep their scores, lose their evidence.
        registry, storage = plane.services.registry, plane.storage
        key = ("demo", "ev")
        group = {
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentGroup",
            "metadata": {"name": "ev", "project": "demo"},
            "spec": {"agent": "helper", "evaluation": {"environment": "arithmetic"}},
            "status": {"phase": "Succeeded", "finishedAt": run["status"]["finishedAt"], "evaluation": {}},
        }
        registry.groups[key] = group
        storage.write_json(layout.group_document(*key), group)
        case = {"run": "ev-0", "state": "Scored", "verdict": "pass", "reward": 1.0, "evidence": SECRET}
        storage.write_json(layout.evaluation_case("demo", "ev", "ev-0"), case)
        sweeper = _sweeper(plane)
        assert (await sweeper.sweep(_later(run, timedelta(days=29)))).groups == []
        assert (await sweeper.sweep(_later(run, timedelta(days=31)))).groups == [key]
        kept = storage.read_json(layout.evaluation_case("demo", "ev", "ev-0"))
        assert kept == {**case, "evidence": ""}
        assert storage.read_json(layout.group_document(*key))["status"]["payloadsExpiredAt"]
        with pytest.raises(PayloadExpired) as expired:
            await plane.services.evaluations.group_results("demo", "ev")
        assert expired.value.details["kind"] == "AgentGroup"

    asyncio.run(scenario())


def test_a_finished_run_an_unfinished_group_or_parent_still_reads_waits_for_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("parent"))
        member = await _finished_run(plane, "member")
        child = await _finished_run(plane, "child")
        registry = plane.services.registry
        # As a group's member and a program's child are marked (the test sets the marks directly).
        member["spec"]["group"] = "g"
        registry.groups[("demo", "g")] = {
            "metadata": {"name": "g"},
            "spec": {"agent": "helper"},
            "status": {"phase": "Running"},
        }
        child["status"]["parent"] = "parent"
        sweeper = _sweeper(plane, payloads="1s", workspaces="1s")
        later = datetime.now(UTC) + timedelta(days=1)
        report = await sweeper.sweep(later)
        assert report.payloads == [] and report.workspaces == []
        due = sweeper.next_due(later)
        assert due is not None and due > later  # looked at again soon, not at once in a loop
        registry.groups[("demo", "g")]["status"]["phase"] = "Succeeded"
        report = await sweeper.sweep(later)
        assert report.payloads == [("demo", "member")]
        (parent,) = plane.run_actors.of("parent")
        parent.end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: registry.is_over(("demo", "parent")), what="the parent done")
        assert ("demo", "child") in (await sweeper.sweep(later)).payloads

    asyncio.run(scenario())


def test_a_workspace_on_another_node_is_removed_there(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        run = await _finished_run(plane, "r5")
        run["status"]["sandbox"]["nodeId"] = "node-b"  # as its actor reported it
        removed: list[tuple[str, str]] = []

        async def remove_on_node(node: str, path: str) -> bool:
            removed.append((node, path))
            return True

        from dataclasses import replace

        settings = replace(plane.settings, payload_retention="30d", workspace_retention="24h")
        sweeper = RetentionSweeper(plane.services.registry, settings, remove_on_node=remove_on_node)
        await sweeper.sweep(_later(run, timedelta(hours=25)))
        assert removed == [("node-b", plane.services.supervisor.workspace("demo", "r5"))]

    asyncio.run(scenario())
