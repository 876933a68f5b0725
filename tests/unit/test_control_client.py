"""The control plane's one client, without Ray: each method reaches its actor method, and each
policy (Serve's fail-fast, the engine's ride-out-restarts) does what its caller relies on."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from ray.exceptions import RayActorError, RayTaskError

from nodus.errors import NotFound, Unavailable
from nodus.lifecycle import RunPhase, RunReason
from nodus_ray.control.client import ControlPlaneClient, FailFast, RideOutRestarts, RunReport
from nodus_ray.control.list_query import ListKind, ListQuery

_FAST = RideOutRestarts(patience_seconds=5.0, first_delay_seconds=0.001, max_delay_seconds=0.004)


class _Method:
    def __init__(self, handle: _Handle, name: str) -> None:
        self._handle = handle
        self._name = name

    def remote(self, *args: Any) -> Awaitable[Any]:
        self._handle.calls.append((self._name, args))
        return self._handle.answer(self._name, args)


class _Handle:
    """A fake actor handle: records ``handle.m.remote(*args)``; ``answer`` makes the awaitable."""

    def __init__(self, answer: Callable[[str, tuple[Any, ...]], Awaitable[Any]] | None = None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.answer = answer or self._echo

    @staticmethod
    async def _echo(name: str, args: tuple[Any, ...]) -> Any:
        return {"method": name, "args": args}

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)


def _client(handle: Any, policy: Any = None, lookups: list[int] | None = None) -> ControlPlaneClient:
    def locate() -> Any:
        if lookups is not None:
            lookups.append(1)
        return handle

    return ControlPlaneClient(policy or FailFast(), locate=locate)


_QUERY = ListQuery(ListKind.AGENT_RUNS, "p", label_selector="team=a", limit=7)

# (client method, its arguments, the actor method, the arguments the actor receives)
_CALLS: list[tuple[str, tuple[Any, ...], str, tuple[Any, ...]]] = [
    ("ready", (), "ready", ()),
    ("price_table", (), "price_table", ()),
    ("list_agents", ("p",), "list_agents", ("p",)),
    ("apply_agent", ("p", {"k": 1}, "create"), "apply_agent", ("p", {"k": 1}, "create")),
    ("apply_agent", ("p", {"k": 1}), "apply_agent", ("p", {"k": 1}, "apply")),
    ("get_agent", ("p", "a"), "get_agent", ("p", "a")),
    ("patch_agent", ("p", "a", {"spec": {}}), "patch_agent", ("p", "a", {"spec": {}})),
    ("delete_agent", ("p", "a"), "delete_agent", ("p", "a")),
    ("list_runs", ("p", "ag", "gr"), "list_runs", ("p", "ag", "gr", None)),
    ("list_runs", ("p",), "list_runs", ("p", None, None, None)),
    ("list_runs", ("p", None, None, "parent"), "list_runs", ("p", None, None, "parent")),
    ("list_page", (_QUERY,), "list_page", (_QUERY,)),
    ("create_run", ("p", {"d": 1}), "create_run", ("p", {"d": 1}, "create")),
    ("create_runs", ("p", {"items": []}, "key"), "create_runs", ("p", {"items": []}, "key")),
    ("get_run", ("p", "r"), "get_run", ("p", "r")),
    ("delete_run", ("p", "r"), "delete_run", ("p", "r")),
    ("cancel_run", ("p", "r"), "cancel_run", ("p", "r")),
    ("send_message", ("p", "r", "hi", "k1", "note"), "send_message", ("p", "r", "hi", "k1", "note")),
    ("send_message", ("p", "r", "hi"), "send_message", ("p", "r", "hi", None, "message")),
    ("resolve_run", ("p", "r", {"step": "s"}), "resolve_run", ("p", "r", {"step": "s"})),
    ("run_events", ("p", "r", 4), "run_events", ("p", "r", 4)),
    ("run_steps", ("p", "r"), "run_steps", ("p", "r")),
    ("run_answer", ("p", "r"), "run_answer", ("p", "r")),
    ("upload_source", ("p", {"main.py": "x = 1"}), "upload_source", ("p", {"main.py": "x = 1"})),
    ("run_outputs", ("p", "r"), "run_outputs", ("p", "r")),
    ("run_output", ("p", "r", "report"), "run_output", ("p", "r", "report")),
    ("run_logs", ("p", "r"), "run_logs", ("p", "r")),
    ("model_access", ("p", "r"), "model_access", ("p", "r")),
    ("run_secrets", ("p", "r"), "run_secrets", ("p", "r")),
    ("reserve_credits", ("p", "r", "0.25", 2), "reserve_credits", ("p", "r", "0.25", 2)),
    ("next_message", ("p", "r", 2), "next_message", ("p", "r", 2, None)),
    ("next_message", ("p", "r", 2, "approval"), "next_message", ("p", "r", 2, "approval")),
    ("spawn_child", ("p", "r", "k", "in", "5m", "0.1"), "spawn_child", ("p", "r", "k", "in", "5m", "0.1")),
    ("spawn_child", ("p", "r", "k", "in"), "spawn_child", ("p", "r", "k", "in", None, None)),
    ("children_status", ("p", "r", ["r-k"]), "children_status", ("p", "r", ["r-k"])),
    (
        "continue_as_new",
        ("p", "r", 2, 0, "next", {"user": 3}),
        "continue_as_new",
        ("p", "r", 2, 0, "next", {"user": 3}),
    ),
    ("continue_as_new", ("p", "r", 2, 0, "next"), "continue_as_new", ("p", "r", 2, 0, "next", None)),
    ("suspend_run", ("p", "r"), "suspend_run", ("p", "r")),
    ("resume_run", ("p", "r"), "resume_run", ("p", "r")),
    ("retry_run", ("p", "r"), "retry_run", ("p", "r")),
    ("fork_run", ("p", "r", "3", "r-b", None), "fork_run", ("p", "r", "3", "r-b", None)),
    ("list_groups", ("p",), "list_groups", ("p",)),
    ("apply_group", ("p", {"g": 1}, "create"), "apply_group", ("p", {"g": 1}, "create")),
    ("get_group", ("p", "g"), "get_group", ("p", "g")),
    ("patch_group", ("p", "g", {"spec": {}}), "patch_group", ("p", "g", {"spec": {}})),
    ("delete_group", ("p", "g"), "delete_group", ("p", "g")),
    ("cancel_group", ("p", "g"), "cancel_group", ("p", "g")),
    ("group_results", ("p", "g"), "group_results", ("p", "g")),
    ("export_run", ("p", "r", "atif"), "export_run", ("p", "r", "atif")),
    ("export_evaluation", ("p", "g", "inspect", 2), "export_evaluation", ("p", "g", "inspect", 2)),
    ("compare_evaluations", ("p", "a", "b"), "compare_evaluations", ("p", "a", "b")),
    ("list_environments", ("p",), "list_environments", ("p",)),
    ("group_snapshot", ("p", "g"), "group_snapshot", ("p", "g")),
    ("start_member", ("p", "r"), "start_member", ("p", "r")),
    ("cancel_member", ("p", "r", "DependencyFailed"), "cancel_member", ("p", "r", "DependencyFailed")),
    ("group_status", ("p", "g", {"phase": "Running"}, {"r": "GroupWait"}), "group_status", None),
    ("list_secrets", ("p",), "list_secrets", ("p",)),
    ("apply_secret", ("p", {"s": 1}, "create"), "apply_secret", ("p", {"s": 1}, "create")),
    ("get_secret", ("p", "s"), "get_secret", ("p", "s")),
    ("delete_secret", ("p", "s"), "delete_secret", ("p", "s")),
    ("get_credits", ("p",), "get_credits", ("p",)),
    ("add_credits", ("p", "5"), "add_credits", ("p", "5")),
    ("reserve_budget", ("p", "r", "0.25", 2), "reserve_budget", ("p", "r", "0.25", 2)),
    ("apply_budget", ("p", {"k": 1}), "apply_budget", ("p", {"k": 1}, "apply")),
    ("patch_budget", ("p", "b", {"spec": {}}), "patch_budget", ("p", "b", {"spec": {}})),
    ("get_budget", ("p", "b"), "get_budget", ("p", "b")),
    ("list_budgets", ("p",), "list_budgets", ("p",)),
    ("delete_budget", ("p", "b"), "delete_budget", ("p", "b")),
    ("authenticate", ("digest",), "authenticate", ("digest",)),
    ("list_tokens", ("p",), "list_tokens", ("p",)),
    ("create_token", ("p", {"t": 1}, "*/admin"), "create_token", ("p", {"t": 1}, "*/admin")),
    ("get_token", ("p", "t"), "get_token", ("p", "t")),
    ("revoke_token", ("p", "t"), "revoke_token", ("p", "t")),
    ("report", ("p", "r", {"attempts": 2}), "report", ("p", "r", {"attempts": 2})),
    ("apply_webhook", ("p", {"k": 1}), "apply_webhook", ("p", {"k": 1}, "apply")),
    ("patch_webhook", ("p", "w", {"spec": {}}), "patch_webhook", ("p", "w", {"spec": {}})),
    ("get_webhook", ("p", "w"), "get_webhook", ("p", "w")),
    ("list_webhooks", ("p",), "list_webhooks", ("p",)),
    ("delete_webhook", ("p", "w"), "delete_webhook", ("p", "w")),
    ("webhook_deliveries", ("p", "w", 5), "webhook_deliveries", ("p", "w", 5)),
    ("webhook_test_event", ("p", "w"), "webhook_test_event", ("p", "w")),
]


@pytest.mark.parametrize(("method", "args", "actor_method", "received"), _CALLS)
def test_each_method_reaches_its_actor_method(
    method: str, args: tuple[Any, ...], actor_method: str, received: tuple[Any, ...] | None
) -> None:
    handle = _Handle()
    asyncio.run(getattr(_client(handle), method)(*args))
    assert handle.calls == [(actor_method, args if received is None else received)]


def test_every_public_method_is_covered_and_exists_on_the_control_plane_with_its_parameters() -> None:
    public = {
        name
        for name, member in inspect.getmembers(ControlPlaneClient, inspect.iscoroutinefunction)
        if not name.startswith("_")
    }
    assert public == {method for method, *_ in _CALLS}
    from nodus_ray.control.plane import ControlPlane  # here: its import starts no Ray, but is heavy

    for name in public:
        actor = getattr(ControlPlane, name, None)
        assert actor is not None and inspect.iscoroutinefunction(actor), f"ControlPlane has no {name}"
        client_params = list(inspect.signature(getattr(ControlPlaneClient, name)).parameters)[1:]
        # Ray's tracing adds ``_ray_trace_ctx`` to an actor class's methods once it is decorated.
        actor_params = [p for p in list(inspect.signature(actor).parameters)[1:] if not p.startswith("_ray")]
        assert client_params == actor_params, name


def test_a_run_report_sends_only_what_was_set_as_stored_strings() -> None:
    handle = _Handle()
    report = RunReport(
        phase=RunPhase.RUNNING, reason=None, message=None, startedAt="t0", sandbox={"node": "n"}
    )
    asyncio.run(_client(handle).report("p", "r", report))
    [(name, (project, run, patch))] = handle.calls
    assert (name, project, run) == ("report", "p", "r")
    assert patch == {
        "phase": "Running",
        "reason": None,
        "message": None,
        "startedAt": "t0",
        "sandbox": {"node": "n"},
    }
    assert type(patch["phase"]) is str
    progress = RunReport(turns=[{"index": 1}], cost={"totalUSD": "0.1"}).to_patch()
    assert progress == {"turns": [{"index": 1}], "cost": {"totalUSD": "0.1"}}
    with pytest.raises(ValueError):
        RunReport(phase="Paused")  # type: ignore[arg-type]
    with pytest.raises(TypeError):  # not a field of a report
        RunReport(answer={})  # type: ignore[call-arg]


def test_cancel_member_sends_a_reason_enum_as_its_plain_string() -> None:
    handle = _Handle()
    asyncio.run(_client(handle).cancel_member("p", "r", RunReason.DEPENDENCY_FAILED))
    [(_, (_, _, reason))] = handle.calls
    assert reason == "DependencyFailed" and type(reason) is str


# -- the engine's policy: ride out restarts -------------------------------------------------


def _flaky(failures: list[BaseException]) -> Callable[[str, tuple[Any, ...]], Awaitable[Any]]:
    async def answer(name: str, args: tuple[Any, ...]) -> Any:
        if failures:
            raise failures.pop(0)
        return "ok"

    return answer


def test_ride_out_retries_a_dead_actor_and_looks_the_handle_up_again() -> None:
    handle = _Handle(_flaky([RayActorError(), RayActorError()]))
    lookups: list[int] = []
    client = _client(handle, _FAST, lookups)
    assert asyncio.run(client.get_run("p", "r")) == "ok"
    assert len(handle.calls) == 3 and len(lookups) == 3  # forgotten after each death


def test_ride_out_waits_for_a_control_plane_that_is_not_there_yet() -> None:
    handle = _Handle()
    lookups: list[int] = []

    def locate() -> Any:
        lookups.append(1)
        if len(lookups) < 3:
            raise ValueError("Failed to look up actor")
        return handle

    client = ControlPlaneClient(_FAST, locate=locate)
    assert asyncio.run(client.ready()) == {"method": "ready", "args": ()}
    assert len(lookups) == 3


def test_ride_out_looks_the_handle_up_once_for_many_calls() -> None:
    handle = _Handle()
    lookups: list[int] = []
    client = _client(handle, _FAST, lookups)

    async def many() -> None:
        for seq in range(5):
            await client.report("p", "r", {"seq": seq})

    asyncio.run(many())
    assert len(handle.calls) == 5 and len(lookups) == 1


def test_ride_out_gives_up_after_its_patience_with_the_last_error() -> None:
    async def always_dead(name: str, args: tuple[Any, ...]) -> Any:
        raise RayActorError()

    client = _client(
        _Handle(always_dead),
        RideOutRestarts(patience_seconds=0.05, first_delay_seconds=0.01, max_delay_seconds=0.02),
    )
    with pytest.raises(RayActorError):
        asyncio.run(client.start_member("p", "r"))


def test_ride_out_backs_off_doubling_up_to_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def record(seconds: float) -> None:
        slept.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr("nodus_ray.control.client.asyncio.sleep", record)
    handle = _Handle(_flaky([RayActorError() for _ in range(6)]))
    assert asyncio.run(_client(handle, RideOutRestarts(120.0)).get_run("p", "r")) == "ok"
    assert slept == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_ride_out_does_not_retry_an_api_error() -> None:
    handle = _Handle(_flaky([NotFound("agentrun 'r' not found")]))
    with pytest.raises(NotFound):
        asyncio.run(_client(handle, _FAST).model_access("p", "r"))
    assert len(handle.calls) == 1


def test_the_engine_default_is_two_minutes_of_patience() -> None:
    policy = ControlPlaneClient.for_engine().policy
    assert isinstance(policy, RideOutRestarts) and policy.patience_seconds == 120.0
    assert ControlPlaneClient.for_engine(30.0).policy == RideOutRestarts(30.0)


# -- Serve's policy: fail fast with API errors ---------------------------------------------


def test_fail_fast_answers_unavailable_when_no_control_plane_runs() -> None:
    def locate() -> Any:
        raise ValueError("Failed to look up actor")

    with pytest.raises(Unavailable, match="not running; run `nodus up`"):
        asyncio.run(ControlPlaneClient(FailFast(), locate=locate).ready())


def test_fail_fast_answers_unavailable_once_and_forgets_a_dead_handle() -> None:
    handle = _Handle(_flaky([RayActorError()]))
    lookups: list[int] = []
    client = _client(handle, FailFast(), lookups)

    async def twice() -> Any:
        with pytest.raises(Unavailable, match="restarting"):
            await client.list_agents("p")
        return await client.list_agents("p")

    assert asyncio.run(twice()) == "ok"
    assert len(handle.calls) == 2 and len(lookups) == 2


def test_fail_fast_unwraps_an_api_error_raised_inside_the_control_plane() -> None:
    refusal = NotFound("agentrun 'r' not found", details={"kind": "AgentRun", "name": "r"})
    handle = _Handle(_flaky([RayTaskError("get_run", "traceback", refusal)]))
    with pytest.raises(NotFound) as raised:
        asyncio.run(_client(handle).get_run("p", "r"))
    assert raised.value is refusal


def test_fail_fast_passes_an_api_error_and_a_bug_through_without_retrying() -> None:
    handle = _Handle(_flaky([NotFound("gone")]))
    with pytest.raises(NotFound):
        asyncio.run(_client(handle).get_run("p", "r"))
    bug = RayTaskError("get_run", "traceback", KeyError("status"))
    handle = _Handle(_flaky([bug]))
    with pytest.raises(RayTaskError):
        asyncio.run(_client(handle).get_run("p", "r"))
    assert len(handle.calls) == 1
