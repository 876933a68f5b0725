"""Startup recovery happens once, before the facade serves a call; the facade only delegates.

A control plane that Ray has just restarted is called at once by run actors and group
supervisors; those calls must wait for it to have read storage (a report or a start_member
that reached an empty control plane used to be dropped), and recovery runs once however many
calls wait. Ray's own launchers are replaced by fakes, so nothing here starts Ray.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import ray

from nodus_ray.control.plane import ControlPlane
from nodus_ray.control.recovery import RecoveryGate
from nodus_ray.control.services import compose
from nodus_ray.settings import ServerSettings
from tests.unit.test_control_support import (
    FakeGroupSupervisors,
    FakeRunActors,
    agent_doc,
    group_doc,
    make_plane,
    run_doc,
    until,
)

# The facade's contract with Serve, the run actors, the group supervisors and `nodus up`.
FACADE = {
    "ready": "(self)",
    "claim_slot": "(self, slot: 'str')",
    "running_settings": "(self)",
    "apply_agent": "(self, project: 'str', document: 'dict[str, Any]', mode: 'str' = 'apply')",
    "patch_agent": "(self, project: 'str', name: 'str', patch: 'dict[str, Any]')",
    "get_agent": "(self, project: 'str', name: 'str')",
    "list_agents": "(self, project: 'str')",
    "delete_agent": "(self, project: 'str', name: 'str')",
    "price_table": "(self)",
    "create_run": "(self, project: 'str', document: 'dict[str, Any]', mode: 'str' = 'create')",
    "create_runs": "(self, project: 'str', document: 'dict[str, Any]', idempotency_key: 'str | None' = None)",
    "get_run": "(self, project: 'str', name: 'str')",
    "list_runs": "(self, project: 'str', agent: 'str | None' = None, group: 'str | None' = None, "
    "parent: 'str | None' = None)",
    "list_page": "(self, query: 'ListQuery')",
    "run_steps": "(self, project: 'str', name: 'str')",
    "run_events": "(self, project: 'str', name: 'str', after_seq: 'int')",
    "run_answer": "(self, project: 'str', name: 'str')",
    "cancel_run": "(self, project: 'str', name: 'str')",
    "delete_run": "(self, project: 'str', name: 'str')",
    "report": "(self, project: 'str', name: 'str', patch: 'dict[str, Any]')",
    "resolve_run": "(self, project: 'str', name: 'str', body: 'dict[str, Any]')",
    "send_message": "(self, project: 'str', name: 'str', payload: 'Any', message_key: 'str | None' = None, "
    "message_name: 'str' = 'message')",
    "next_message": "(self, project: 'str', name: 'str', after_seq: 'int', message_name: 'str | None' = None)",
    "spawn_child": "(self, project: 'str', parent: 'str', key: 'str', input_text: 'str', "
    "deadline: 'str | None' = None, cap_usd: 'str | None' = None)",
    "children_status": "(self, project: 'str', parent: 'str', names: 'list[str]')",
    "continue_as_new": "(self, project: 'str', name: 'str', attempt: 'int', generation: 'int', "
    "input_text: 'str', read: 'dict[str, int] | None' = None)",
    "suspend_run": "(self, project: 'str', name: 'str')",
    "resume_run": "(self, project: 'str', name: 'str')",
    "retry_run": "(self, project: 'str', name: 'str')",
    "fork_run": (
        "(self, project: 'str', name: 'str', at: 'str', new_name: 'str | None' = None, "
        "new_input: 'str | None' = None)"
    ),
    "upload_source": "(self, project: 'str', files: 'dict[str, str]')",
    "run_outputs": "(self, project: 'str', name: 'str')",
    "run_output": "(self, project: 'str', name: 'str', output: 'str')",
    "run_logs": "(self, project: 'str', name: 'str')",
    "get_group": "(self, project: 'str', name: 'str')",
    "list_groups": "(self, project: 'str')",
    "apply_group": "(self, project: 'str', document: 'dict[str, Any]', mode: 'str' = 'apply')",
    "patch_group": "(self, project: 'str', name: 'str', patch: 'dict[str, Any]')",
    "cancel_group": "(self, project: 'str', name: 'str')",
    "delete_group": "(self, project: 'str', name: 'str')",
    "group_snapshot": "(self, project: 'str', name: 'str')",
    "start_member": "(self, project: 'str', name: 'str')",
    "cancel_member": "(self, project: 'str', name: 'str', reason: 'str')",
    "group_status": "(self, project: 'str', name: 'str', status: 'dict[str, Any]', queued_reasons: 'dict[str, str]')",
    "group_results": "(self, project: 'str', name: 'str')",
    "export_run": "(self, project: 'str', name: 'str', format: 'str')",
    "export_evaluation": "(self, project: 'str', name: 'str', format: 'str', page: 'int' = 0)",
    "compare_evaluations": "(self, project: 'str', a: 'str', b: 'str')",
    "list_environments": "(self, project: 'str')",
    "apply_secret": "(self, project: 'str', document: 'dict[str, Any]', mode: 'str' = 'apply')",
    "get_secret": "(self, project: 'str', name: 'str')",
    "list_secrets": "(self, project: 'str')",
    "delete_secret": "(self, project: 'str', name: 'str')",
    "configure_model_key": "(self, key: 'str | None')",
    "model_access": "(self, project: 'str', name: 'str')",
    "run_secrets": "(self, project: 'str', name: 'str')",
    "get_credits": "(self, project: 'str')",
    "add_credits": "(self, project: 'str', amount: 'str')",
    "reserve_credits": "(self, project: 'str', name: 'str', amount: 'str', attempt: 'int | None' = None)",
    "reserve_budget": "(self, project: 'str', name: 'str', amount: 'str', attempt: 'int | None' = None)",
    "apply_budget": "(self, project: 'str', document: 'dict[str, Any]', mode: 'str' = 'apply')",
    "patch_budget": "(self, project: 'str', name: 'str', patch: 'dict[str, Any]')",
    "get_budget": "(self, project: 'str', name: 'str')",
    "list_budgets": "(self, project: 'str')",
    "delete_budget": "(self, project: 'str', name: 'str')",
    "apply_webhook": "(self, project: 'str', document: 'dict[str, Any]', mode: 'str' = 'apply')",
    "patch_webhook": "(self, project: 'str', name: 'str', patch: 'dict[str, Any]')",
    "get_webhook": "(self, project: 'str', name: 'str')",
    "list_webhooks": "(self, project: 'str')",
    "delete_webhook": "(self, project: 'str', name: 'str')",
    "webhook_deliveries": "(self, project: 'str', name: 'str', limit: 'int' = 50)",
    "webhook_test_event": "(self, project: 'str', name: 'str')",
    "authenticate": "(self, digest: 'str')",
    "create_token": "(self, project: 'str', document: 'dict[str, Any]', created_by: 'str')",
    "get_token": "(self, project: 'str', name: 'str')",
    "list_tokens": "(self, project: 'str')",
    "revoke_token": "(self, project: 'str', name: 'str')",
    "ensure_operator_token": "(self, current: 'str | None')",
}
# Answered without waiting: they read no resource (settings, prices, installed environments),
# or are a parked actor of an earlier control plane asking for a run (it is told to end).
UNGATED = {"claim_slot", "running_settings", "price_table", "list_environments"}


def test_the_facade_keeps_every_public_method_and_signature_and_gates_all_that_read_resources() -> None:
    public = {
        name: member
        for name, member in inspect.getmembers(ControlPlane, inspect.iscoroutinefunction)
        if not name.startswith("_")
    }
    # Ray's tracing adds a keyword of its own to an actor class's methods once it is made remote.
    signatures = {
        name: str(inspect.signature(method)).split(" ->")[0].replace(", *, _ray_trace_ctx=None", "")
        for name, method in public.items()
    }
    assert signatures == FACADE
    gated = {name for name, method in public.items() if _is_gated(method)}
    assert gated == set(FACADE) - UNGATED


def _is_gated(method: object) -> bool:
    while method is not None:
        if getattr(method, "after_recovery", False):
            return True
        method = getattr(method, "__wrapped__", None)
    return False


def test_recovery_runs_once_for_every_waiting_call_and_again_only_after_a_failure() -> None:
    async def scenario() -> None:
        runs: list[int] = []
        release = asyncio.Event()

        async def recover() -> None:
            runs.append(len(runs))
            await release.wait()
            if len(runs) == 1:
                raise RuntimeError("storage unreachable")

        gate = RecoveryGate(recover)
        waiters = [asyncio.ensure_future(gate.wait()) for _ in range(5)]
        impatient = asyncio.ensure_future(gate.wait())
        await asyncio.sleep(0)
        impatient.cancel()  # a caller that gives up does not cancel the recovery
        await asyncio.sleep(0)
        assert runs == [0] and not gate.recovered
        release.set()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(result, RuntimeError) for result in results)
        await gate.wait()  # tried again, and it succeeds this time
        await gate.wait()
        assert runs == [0, 1] and gate.recovered

    asyncio.run(scenario())


def test_calls_to_a_just_restarted_control_plane_wait_for_it_to_load(tmp_path: Path) -> None:
    settings = ServerSettings(
        storage_uri=str(tmp_path / "storage"),
        sandbox_root=str(tmp_path / "sandboxes"),
        secret_key_file=str(tmp_path / "secret.key"),
        run_pool_per_node=0,
    )

    async def scenario() -> None:
        first = ControlPlane(settings, run_actors=FakeRunActors(), group_actors=FakeGroupSupervisors())
        await first.apply_agent("demo", agent_doc())
        await first.apply_group("demo", group_doc("g"))
        await first.create_run("demo", run_doc("g-t1", group="g", taskKey="t1"))

        # recovery starts with the first call
        restarted = ControlPlane(settings, run_actors=FakeRunActors(), group_actors=FakeGroupSupervisors())
        # The first calls a supervisor and a run actor make, before anything else asked it:
        started, _ = await asyncio.gather(
            restarted.start_member("demo", "g-t1"),
            restarted.report("demo", "g-t1", {"phase": "Running"}),
        )
        assert started is True  # the run was known: its admitted place is not held forever
        run = await restarted.get_run("demo", "g-t1")
        assert run["status"]["admittedAt"] and run["status"]["phase"] == "Running"
        assert restarted.recovery.recovered
        assert (await restarted.ready())["runs"] == 1
        assert repr(restarted).startswith("ControlPlane(storage=")
        for task in first._background + restarted._background:
            task.cancel()

    asyncio.run(scenario())
    assert not ray.is_initialized()


def test_runs_get_their_actors_only_once_recovery_is_over(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.groups.apply_group("demo", group_doc("g"))
        await plane.services.runs.create_run("demo", run_doc("r1"))
        await until(lambda: plane.stored_phase("r1") == "Running", what="the first actor's Running report")
        plane.run_actors.live.clear()  # `ray stop --force`: every actor is gone
        services = compose(
            plane.settings,
            run_actors=plane.run_actors,
            group_actors=plane.group_actors,
            graders=plane.graders,
        )
        loads = len(plane.group_actors.supervisors[("demo", "g")].called("load"))
        refill = services.run_pool.refill

        async def slow_refill() -> None:  # Ray's GCS answering slowly: recovery takes a while
            await asyncio.sleep(0.2)
            await refill()

        services.run_pool.refill = slow_refill  # type: ignore[method-assign]
        await services.recover()
        # Nothing started while recovery ran (each start used to wait for the control plane to
        # have started; started mid-recovery, a restarted run ran a command twice).
        assert len(plane.run_actors.of("r1")) == 1
        await until(lambda: plane.run_actors.of("r1")[1:], what="the run's actor after recovery")
        assert len(plane.run_actors.of("r1")) == 2
        assert len(plane.group_actors.supervisors[("demo", "g")].called("load")) == loads + 1

    asyncio.run(scenario())
