"""The run and group lifecycles: the wire strings, the terminal and parked sets, the transitions."""

from __future__ import annotations

import json

import pytest

from nodus import resources
from nodus.lifecycle import (
    GROUP_PHASES,
    GROUP_TERMINAL_PHASES,
    GROUP_TRANSITIONS,
    PARKED_REASONS,
    RUN_PHASES,
    RUN_TERMINAL_PHASES,
    RUN_TRANSITIONS,
    BlockedReason,
    GroupPhase,
    GroupReason,
    IllegalTransition,
    RunPhase,
    RunReason,
    check_group_transition,
    check_run_transition,
    is_parked,
    is_terminal,
    run_transition,
)


def test_the_wire_is_the_documents_strings() -> None:
    assert [str(p) for p in RUN_PHASES] == [
        "Pending",
        "Running",
        "Waiting",
        "Succeeded",
        "Failed",
        "Cancelled",
    ]
    assert [str(p) for p in GROUP_PHASES] == ["Running", "Cancelling", "Succeeded", "Failed", "Cancelled"]
    assert RunPhase.WAITING == "Waiting"
    assert json.dumps({"phase": RunPhase.RUNNING, "reason": RunReason.AWAITING_MESSAGE}) == (
        '{"phase": "Running", "reason": "AwaitingMessage"}'
    )
    # The guide's three reasons queued runs wait for, and runs waiting for a person (issue 16).
    assert {str(r) for r in BlockedReason} == {
        "DependencyWait",
        "MaxActiveReached",
        "MaxCostReached",
        "BudgetExceeded",
        "NeedsResolution",
        "RateLimited",  # started runs waiting for the rate limiter (issue 20)
    }
    assert GroupReason.RUNS_FAILED == "RunsFailed"


def test_the_enums_match_the_sdk_resources() -> None:
    assert set(RUN_PHASES) == set(resources.RunPhase.__args__)  # type: ignore[attr-defined]
    assert set(GROUP_PHASES) == set(resources.GroupPhase.__args__)  # type: ignore[attr-defined]
    assert set(RUN_TERMINAL_PHASES) == set(resources.TERMINAL_PHASES)
    assert set(GROUP_TERMINAL_PHASES) == set(resources.GROUP_TERMINAL_PHASES)


def test_the_metrics_label_every_run_phase() -> None:
    from nodus_ray import metrics

    assert tuple(metrics.RUN_PHASES) == RUN_PHASES


def test_every_parked_reason_holds_no_actor_including_credits() -> None:
    # The supervision gives the actor back for every one of these (actorName None); a run
    # waiting for credits is parked too and resumes in a new actor when credits are added.
    assert PARKED_REASONS == {
        "NeedsResolution",
        "MaxCostReached",
        "AwaitingMessage",
        "InsufficientCredits",
        "BudgetExceeded",
        "Sleeping",
        "AwaitingChildren",
        "Suspended",
        "GroupWait",  # a keep-alive group member a message came to, waiting for a free slot
    }
    assert is_parked("Waiting", "GroupWait") and not is_parked("Pending", "GroupWait")
    assert is_parked("Waiting", "InsufficientCredits") and is_parked("Waiting", "BudgetExceeded")
    assert is_parked("Waiting", "Sleeping") and is_parked("Waiting", "Suspended")
    assert not is_parked("Running", "AwaitingMessage")
    assert not is_parked("Waiting", None)


def test_terminal() -> None:
    assert all(is_terminal(p) for p in ("Succeeded", "Failed", "Cancelled"))
    assert not any(is_terminal(p) for p in ("Pending", "Running", "Waiting", "Cancelling"))


# What the engine does today, one pair per path through the code.
_RUN_ALLOWED = [
    ("Pending", "Pending"),  # queued reason changes; admitted
    ("Pending", "Running"),  # the actor starts
    ("Pending", "Failed"),  # refused (SecretNotFound), RunnerLost, deadline while queued
    ("Pending", "Cancelled"),  # cancel, DependencyFailed, GroupCancelled
    ("Running", "Running"),  # a replacement actor replays
    ("Running", "Waiting"),
    ("Running", "Succeeded"),
    ("Running", "Failed"),
    ("Running", "Cancelled"),
    ("Waiting", "Running"),  # a message, credits, a resolution
    ("Waiting", "Failed"),  # deadline, StepCancelled
    ("Waiting", "Cancelled"),
]


@pytest.mark.parametrize(("frm", "to"), _RUN_ALLOWED)
def test_allowed_run_transitions(frm: str, to: str) -> None:
    assert check_run_transition(frm, to) is RunPhase(to)


def test_the_run_table_is_exactly_the_allowed_pairs() -> None:
    pairs = {(str(frm), str(to)) for frm, tos in RUN_TRANSITIONS.items() for to in tos}
    assert pairs == set(_RUN_ALLOWED)


@pytest.mark.parametrize("frm", ["Succeeded", "Failed", "Cancelled"])
@pytest.mark.parametrize("to", [str(p) for p in RUN_PHASES])
def test_a_finished_run_never_changes_phase(frm: str, to: str) -> None:
    with pytest.raises(IllegalTransition) as raised:
        check_run_transition(frm, to)
    assert raised.value.kind == "AgentRun"
    assert (raised.value.frm, raised.value.to) == (frm, to)
    assert frm in str(raised.value) and to in str(raised.value)


@pytest.mark.parametrize(
    ("frm", "to"), [("Waiting", "Pending"), ("Running", "Pending"), ("Pending", "Waiting")]
)
def test_illegal_run_transitions(frm: str, to: str) -> None:
    with pytest.raises(IllegalTransition):
        check_run_transition(frm, to)


@pytest.mark.parametrize(
    ("frm", "to"), [("Running", "Paused"), ("Bogus", "Running"), ("Running", "Cancelling")]
)
def test_unknown_phases_are_illegal(frm: str, to: str) -> None:
    with pytest.raises(IllegalTransition):
        check_run_transition(frm, to)


def test_illegal_transition_is_a_value_error() -> None:
    assert issubclass(IllegalTransition, ValueError)


def test_run_transition_builds_the_patch() -> None:
    patch = run_transition({"phase": "Running"}, RunPhase.WAITING, RunReason.AWAITING_MESSAGE, "turn 1")
    assert patch == {"phase": "Waiting", "reason": "AwaitingMessage", "message": "turn 1"}
    assert type(patch["phase"]) is str and type(patch["reason"]) is str
    assert run_transition({}, "Running", None) == {"phase": "Running", "reason": None, "message": None}
    with pytest.raises(IllegalTransition):
        run_transition({"phase": "Cancelled"}, "Running", None)


_GROUP_ALLOWED = [
    ("Running", "Running"),
    ("Running", "Cancelling"),
    ("Running", "Succeeded"),
    ("Running", "Failed"),
    ("Running", "Cancelled"),
    ("Cancelling", "Cancelling"),
    ("Cancelling", "Cancelled"),
]


def test_the_group_table_is_exactly_the_allowed_pairs() -> None:
    pairs = {(str(frm), str(to)) for frm, tos in GROUP_TRANSITIONS.items() for to in tos}
    assert pairs == set(_GROUP_ALLOWED)
    for frm, to in _GROUP_ALLOWED:
        assert check_group_transition(frm, to) is GroupPhase(to)


@pytest.mark.parametrize(
    ("frm", "to"),
    [
        ("Cancelling", "Running"),
        ("Cancelling", "Succeeded"),
        ("Succeeded", "Running"),
        ("Cancelled", "Cancelling"),
        ("Failed", "Failed"),
        ("Running", "Pending"),
        ("Nope", "Running"),
    ],
)
def test_illegal_group_transitions(frm: str, to: str) -> None:
    with pytest.raises(IllegalTransition) as raised:
        check_group_transition(frm, to)
    assert raised.value.kind == "AgentGroup"


def test_only_a_retry_takes_a_failed_run_back_to_running() -> None:
    from nodus.lifecycle import RUN_RETRY_TRANSITIONS, retry_transition

    assert {str(frm): {str(to) for to in tos} for frm, tos in RUN_RETRY_TRANSITIONS.items()} == {
        "Failed": {"Running"}
    }
    patch = retry_transition({"phase": "Failed", "reason": "ProgramFailed"}, "retried on request")
    assert patch == {"phase": "Running", "reason": None, "message": "retried on request"}
    for frm in ("Pending", "Running", "Waiting", "Succeeded", "Cancelled"):
        with pytest.raises(IllegalTransition):
            retry_transition({"phase": frm})
    with pytest.raises(IllegalTransition):  # the ordinary table still never revives a finished run
        check_run_transition("Failed", "Running")


def test_leaving_waiting_clears_what_the_run_waited_for() -> None:
    waiting = {"phase": "Waiting", "reason": "Sleeping", "wakeAt": "2026-12-01T00:00:00Z", "waitingFor": None}
    assert run_transition(waiting, "Running", None) == {
        "phase": "Running",
        "reason": None,
        "message": None,
        "wakeAt": None,
    }
    children = {"phase": "Waiting", "reason": "AwaitingChildren", "waitingFor": {"children": ["a"]}}
    assert run_transition(children, "Cancelled", "Cancelled")["waitingFor"] is None
    assert "wakeAt" not in run_transition({"phase": "Running", "wakeAt": "x"}, "Waiting", "Sleeping")
