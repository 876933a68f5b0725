"""AgentGroup admission: the rules of "Run agents in parallel", one test each, then a stateful
property test that drives random groups through adds, reports, patches, seal, cancel and
restarts and checks the guarantees after every step."""

from __future__ import annotations

import pickle
from decimal import ROUND_DOWN, Decimal

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from nodus_ray.core.admission import Admission, AdmissionError, Decision, GroupLimits, GroupStatus, Member

D = Decimal
TERMINAL = {"Succeeded", "Failed", "Cancelled"}
STARTED = {"Active", "Waiting"}


def m(key: str, cap: str = "0.10", deps: tuple[str, ...] | list[str] = ()) -> Member:
    return Member(key=key, run=f"g-{key}", cap=D(cap), depends_on=tuple(deps))


def report(adm: Admission, key: str, state: str = "Succeeded", spent: str = "0") -> Decision:
    return adm.progressed(f"g-{key}", state=state, spent=D(spent))


def states(adm: Admission) -> dict[str, tuple[str, str | None]]:
    return {member.key: (member.state, member.reason) for member in adm.members}


def refused(call, code: str, reason: str, field: str | None = None) -> AdmissionError:  # type: ignore[no-untyped-def]
    with pytest.raises(AdmissionError) as caught:
        call()
    assert (caught.value.code, caught.value.reason) == (code, reason), caught.value.message
    if field is not None:
        assert caught.value.field == field
    return caught.value


# -- the guide's example -----------------------------------------------------------------------


def test_the_guides_example_runs_two_at_once_and_c_after_a_and_b() -> None:
    adm = Admission(GroupLimits(max_active=2, max_cost=D("0.60")))
    d = adm.add([m("a"), m("b"), m("c", deps=["a", "b"])])
    assert d.start == ["g-a", "g-b"] and d.cancel == []
    assert d.status.phase == "Running"
    assert d.status.counts == {
        "queued": 1,
        "active": 2,
        "waiting": 0,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 0,
        "total": 3,
    }
    assert d.status.blocked_reasons == {
        "DependencyWait": 1,
        "MaxActiveReached": 0,
        "MaxCostReached": 0,
        "NeedsResolution": 0,
    }
    assert adm.queued_reasons == {"g-c": "DependencyWait"}
    assert d.status.reserved == D("0.20")
    for run in d.start:
        adm.started(run)

    d = report(adm, "a", spent="0.03")
    assert d.start == [] and adm.queued_reasons == {"g-c": "DependencyWait"}
    assert (d.status.cost_total, d.status.reserved) == (D("0.03"), D("0.10"))
    d = report(adm, "b", spent="0.02")
    assert d.start == ["g-c"]
    d = adm.seal()
    assert d.status.phase == "Running"
    d = report(adm, "c", spent="0.01")
    assert d.status.phase == "Succeeded" and d.status.reason is None
    assert d.status.counts["succeeded"] == d.status.counts["total"] == 3
    assert d.status.to_dict()["cost"] == {"totalUSD": "0.06", "limitUSD": "0.60", "reservedUSD": "0"}


def test_the_cap_has_room_for_six_runs_and_spend_stays_counted_after_a_run_ends() -> None:
    adm = Admission(GroupLimits(max_cost=D("0.60")))
    d = adm.add([m(k) for k in "abcdefgh"])
    assert d.start == [f"g-{k}" for k in "abcdef"]
    assert d.status.blocked_reasons["MaxCostReached"] == 2
    assert adm.queued_reasons == {"g-g": "GroupWait", "g-h": "GroupWait"}
    assert d.status.message is None  # runs are going; nothing is stuck
    # a ends having spent 0.04: its 0.06 is released, but 0.04 stays spent, so g still does not fit.
    assert report(adm, "a", spent="0.04").start == []
    # b ends having spent nothing: now 0.60 - 0.04 - 4 * 0.10 = 0.16 leaves room for one.
    d = report(adm, "b", spent="0")
    assert d.start == ["g-g"] and d.status.blocked_reasons["MaxCostReached"] == 1


def test_max_active_blocks_and_a_patch_admits_more() -> None:
    adm = Admission(GroupLimits(max_active=1))
    d = adm.add([m("a"), m("b"), m("c")])
    assert d.start == ["g-a"]
    assert d.status.blocked_reasons == {
        "DependencyWait": 0,
        "MaxActiveReached": 2,
        "MaxCostReached": 0,
        "NeedsResolution": 0,
    }
    assert adm.queued_reasons == {"g-b": "GroupWait", "g-c": "GroupWait"}
    d = adm.patch(max_active=3)
    assert d.start == ["g-b", "g-c"] and adm.limits.max_active == 3


def test_a_waiting_run_keeps_its_slot_and_its_reservation() -> None:
    adm = Admission(GroupLimits(max_active=1, max_cost=D("1")))
    adm.add([m("a", cap="0.50"), m("b")])
    d = report(adm, "a", state="Waiting", spent="0.20")
    assert d.start == [] and d.status.counts["waiting"] == 1 and d.status.counts["active"] == 0
    assert d.status.reserved == D("0.30")
    assert d.status.blocked_reasons["MaxActiveReached"] == 1


def test_lowering_max_active_stops_nothing_and_delays_starts() -> None:
    adm = Admission(GroupLimits(max_active=3))
    adm.add([m("a"), m("b"), m("c"), m("d")])
    assert adm.patch(max_active=1).start == []
    assert report(adm, "a").start == []  # still 2 running, limit 1
    assert report(adm, "b").start == []
    assert report(adm, "c").start == ["g-d"]


@pytest.mark.parametrize("value", [0, 1001, True, 2.0])
def test_max_active_must_be_1_to_1000(value: object) -> None:
    adm = Admission(GroupLimits())
    refused(lambda: adm.patch(max_active=value), "Invalid", "OutOfRange", "spec.limits.maxActive")  # type: ignore[arg-type]
    assert adm.limits.max_active == 10
    refused(lambda: GroupLimits(max_active=value), "Invalid", "OutOfRange", "spec.limits.maxActive")  # type: ignore[arg-type]
    assert GroupLimits(max_active=1000).max_active == 1000


def test_money_is_decimal_never_float() -> None:
    refused(lambda: GroupLimits(max_cost=0.6), "Invalid", "InvalidAmount", "spec.maxCostUSD")  # type: ignore[arg-type]
    refused(lambda: GroupLimits(max_cost=D("-1")), "Invalid", "InvalidAmount", "spec.maxCostUSD")
    refused(lambda: GroupLimits(max_cost=D("NaN")), "Invalid", "InvalidAmount", "spec.maxCostUSD")
    adm = Admission(GroupLimits())
    refused(lambda: adm.add([Member("a", "g-a", 0.1, ())]), "Invalid", "InvalidAmount")  # type: ignore[arg-type]


# -- the cost cap --------------------------------------------------------------------------------


def test_the_cap_can_be_raised_to_admit_more_and_never_lowered() -> None:
    adm = Admission(GroupLimits(max_cost=D("0.15")))
    d = adm.add([m("a"), m("b"), m("c")])
    assert d.start == ["g-a"] and d.status.blocked_reasons["MaxCostReached"] == 2
    d = adm.patch(max_cost=D("0.35"))
    assert d.start == ["g-b", "g-c"] and d.status.cost_limit == D("0.35")
    before = (adm.members, adm.status)
    error = refused(lambda: adm.patch(max_cost=D("0.20")), "Conflict", "CapLowered", "spec.maxCostUSD")
    assert "lowered" in error.message
    assert (adm.members, adm.status) == before and adm.limits.max_cost == D("0.35")
    assert adm.patch(max_cost=D("0.35")).start == []  # the same cap is not a lowering


def test_an_uncapped_group_cannot_be_given_a_cap() -> None:
    adm = Admission(GroupLimits())
    refused(lambda: adm.patch(max_cost=D("100")), "Conflict", "CapLowered", "spec.maxCostUSD")


def test_a_cap_below_a_runs_cap_starts_nothing_and_says_so() -> None:
    adm = Admission(GroupLimits(max_cost=D("0.05")))
    d = adm.add([m("a"), m("b", deps=["a"])])
    assert d.start == []
    assert d.status.blocked_reasons == {
        "DependencyWait": 1,
        "MaxActiveReached": 0,
        "MaxCostReached": 1,
        "NeedsResolution": 0,
    }
    assert (
        d.status.message
        == "maxCostUSD $0.05 is below a run's cap $0.10: raise the cap or lower perRunMaxCostUSD"
    )
    assert adm.patch(max_cost=D("0.10")).start == ["g-a"]


def test_a_spent_cap_that_leaves_too_little_says_so() -> None:
    adm = Admission(GroupLimits(max_cost=D("0.25")))
    adm.add([m("a"), m("b"), m("c")])
    report(adm, "a", spent="0.10")
    d = report(adm, "b", spent="0.08")
    assert d.start == [] and d.status.phase == "Running"
    assert d.status.message == (
        "the group has spent $0.18 of its maxCostUSD $0.25; the $0.07 left is below a run's cap $0.10: raise the cap"
    )


def test_a_run_that_does_not_fit_does_not_hold_back_a_smaller_one() -> None:
    # Decision: first fit in creation order. A BYOK run (cap 0, not charged) reserves nothing.
    adm = Admission(GroupLimits(max_cost=D("0.05")))
    d = adm.add([m("big"), m("byok", cap="0")])
    assert d.start == ["g-byok"] and d.status.reserved == 0
    assert adm.queued_reasons == {"g-big": "GroupWait"}


def test_reservation_is_the_remaining_allowance_so_spent_plus_reserved_stays_under_the_cap() -> None:
    adm = Admission(GroupLimits(max_cost=D("0.30")))
    adm.add([m("a"), m("b"), m("c"), m("d")])
    d = report(adm, "a", state="Active", spent="0.07")
    assert (d.status.cost_total, d.status.reserved) == (D("0.07"), D("0.23"))
    assert d.start == []


# -- dependencies --------------------------------------------------------------------------------


def test_a_failed_dependency_cancels_its_dependents_transitively_and_fails_the_group() -> None:
    adm = Admission(GroupLimits())
    adm.add([m("a"), m("b", deps=["a"]), m("c", deps=["b"]), m("x"), m("d", deps=["x", "c"])])
    d = report(adm, "a", state="Failed", spent="0.02")
    assert d.cancel == [
        ("g-b", "DependencyFailed"),
        ("g-c", "DependencyCancelled"),
        ("g-d", "DependencyCancelled"),
    ]
    assert states(adm)["b"] == ("Cancelled", "DependencyFailed")
    assert d.status.phase == "Running"  # not sealed
    report(adm, "x")
    d = adm.seal()
    assert (d.status.phase, d.status.reason) == ("Failed", "RunsFailed")
    assert d.status.counts == {
        "queued": 0,
        "active": 0,
        "waiting": 0,
        "succeeded": 1,
        "failed": 1,
        "cancelled": 3,
        "total": 5,
    }
    assert d.status.message == "1 run failed and 1 run was cancelled because a dependency failed"


def test_a_cancelled_dependency_cancels_dependents_and_does_not_fail_the_group() -> None:
    # Decision: a run cancelled by its user (and the runs cancelled because of it) does not fail the group.
    adm = Admission(GroupLimits())
    adm.add([m("a"), m("b", deps=["a"]), m("c", deps=["b"]), m("z")])
    d = report(adm, "a", state="Cancelled")
    assert d.cancel == [("g-b", "DependencyCancelled"), ("g-c", "DependencyCancelled")]
    report(adm, "z")
    d = adm.seal()
    assert (d.status.phase, d.status.reason) == ("Succeeded", None)


def test_a_run_added_after_its_dependency_failed_is_cancelled_at_once() -> None:
    adm = Admission(GroupLimits())
    adm.add([m("a")])
    report(adm, "a", state="Failed")
    d = adm.add([m("b", deps=["a"])])
    assert d.start == [] and d.cancel == [("g-b", "DependencyFailed")]


def test_a_failed_dependency_outweighs_a_cancelled_one() -> None:
    members = [
        Member("x", "g-x", D("0.1"), (), "Cancelled"),
        Member("y", "g-y", D("0.1"), (), "Failed"),
        Member("z", "g-z", D("0.1"), ("x", "y")),
    ]
    adm = Admission.rebuild(GroupLimits(), members, sealed=True, cancelled=False)
    d = adm.decide()
    assert d.cancel == [("g-z", "DependencyFailed")] and d.status.phase == "Failed"


def test_a_failed_run_fails_the_group_and_a_queued_run_started_only_after_its_dependencies_succeed() -> None:
    adm = Admission(GroupLimits())
    assert adm.add([m("a"), m("b", deps=["a"])]).start == ["g-a"]
    assert report(adm, "a", state="Waiting").start == []
    assert report(adm, "a", state="Active").start == []
    assert report(adm, "a").start == ["g-b"]
    adm.seal()
    d = report(adm, "b", state="Failed", spent="0.10")
    assert (d.status.phase, d.status.reason, d.status.message) == ("Failed", "RunsFailed", "1 run failed")


# -- seal, status ---------------------------------------------------------------------------------


def test_a_sealed_group_with_no_runs_succeeds() -> None:
    d = Admission(GroupLimits()).seal()
    assert (d.status.phase, d.status.reason) == ("Succeeded", None)
    assert d.status.counts["total"] == 0


def test_a_group_finishes_only_once_sealed() -> None:
    adm = Admission(GroupLimits())
    adm.add([m("a")])
    d = report(adm, "a")
    assert d.status.phase == "Running"
    assert d.status.message == "every run has finished; the group finishes once it is sealed"
    assert adm.seal().status.phase == "Succeeded"


def test_a_sealed_group_refuses_new_runs_and_seal_cannot_be_undone() -> None:
    adm = Admission(GroupLimits())
    adm.add([m("a")])
    adm.seal()
    refused(lambda: adm.add([m("b")]), "Conflict", "GroupSealed")
    assert adm.seal().status.phase == "Running" and adm.sealed
    assert [member.key for member in adm.members] == ["a"]


# -- cancel ----------------------------------------------------------------------------------------


def test_cancel_cancels_unfinished_runs_keeps_finished_ones_and_goes_cancelling_then_cancelled() -> None:
    adm = Admission(GroupLimits(max_active=2))
    adm.add([m("a"), m("b"), m("c"), m("d")])
    report(adm, "a", spent="0.05")  # c starts
    d = adm.cancel()
    assert d.start == []
    assert d.cancel == [("g-b", "GroupCancelled"), ("g-c", "GroupCancelled"), ("g-d", "GroupCancelled")]
    assert d.status.phase == "Cancelling"
    assert states(adm) == {
        "a": ("Succeeded", None),
        "b": ("Active", None),
        "c": ("Active", None),
        "d": ("Cancelled", "GroupCancelled"),
    }
    assert adm.pending_cancels == {"g-b": "GroupCancelled", "g-c": "GroupCancelled"}
    refused(lambda: adm.add([m("e")]), "Conflict", "GroupCancelled")
    assert adm.cancel().cancel == []  # idempotent: nothing handed out twice
    assert report(adm, "b", state="Cancelled", spent="0.01").status.phase == "Cancelling"
    d = report(adm, "c", spent="0.02")  # finished before the cancel reached it: keeps its result
    assert d.status.phase == "Cancelled"
    assert states(adm)["b"] == ("Cancelled", "GroupCancelled") and states(adm)["c"] == ("Succeeded", None)
    assert d.status.cost_total == D("0.08") and adm.pending_cancels == {}


def test_cancelling_a_finished_group_keeps_its_result() -> None:
    adm = Admission(GroupLimits())
    adm.add([m("a")])
    report(adm, "a")
    adm.seal()
    d = adm.cancel()
    assert d.status.phase == "Succeeded" and not adm.cancelled


def test_cancelling_an_unsealed_group_with_nothing_running_is_immediate() -> None:
    adm = Admission(GroupLimits(max_cost=D("0.01")))
    adm.add([m("a")])
    d = adm.cancel()
    assert d.cancel == [("g-a", "GroupCancelled")] and d.status.phase == "Cancelled"


# -- adding runs -----------------------------------------------------------------------------------


def test_max_pending_counts_unfinished_runs_and_refuses_the_whole_batch() -> None:
    adm = Admission(GroupLimits(max_active=1, max_pending=3))
    adm.add([m("a"), m("b")])
    refused(lambda: adm.add([m("c"), m("d")]), "Conflict", "MaxPendingReached", "spec.limits.maxPending")
    assert [member.key for member in adm.members] == ["a", "b"]
    report(adm, "a")
    assert adm.add([m("c"), m("d")]).status.counts["total"] == 4
    adm.patch(max_pending=10)
    assert adm.limits.max_pending == 10


def test_a_batch_with_one_bad_run_adds_nothing() -> None:
    adm = Admission(GroupLimits())
    adm.add([m("x")])
    before = (adm.members, adm.status)
    error = refused(
        lambda: adm.add([m("y"), m("z", deps=["x", "nope"]), m("w")]),
        "Invalid",
        "UnknownDependency",
        "spec.dependsOn[1]",
    )
    assert error.index == 1 and "'nope'" in error.message
    assert (adm.members, adm.status) == before
    assert adm.decide().start == []


def test_a_dependency_must_come_earlier_in_the_batch() -> None:
    adm = Admission(GroupLimits())
    error = refused(
        lambda: adm.add([m("u", deps=["v"]), m("v")]), "Invalid", "UnknownDependency", "spec.dependsOn[0]"
    )
    assert "later in the batch" in error.message
    assert adm.add([m("v"), m("u", deps=["v"])]).start == ["g-v"]


def test_cycles_are_refused() -> None:
    adm = Admission(GroupLimits())
    error = refused(lambda: adm.add([m("p", deps=["q"]), m("q", deps=["p"])]), "Invalid", "DependencyCycle")
    assert "p -> q -> p" in error.message
    refused(lambda: adm.add([m("s", deps=["s"])]), "Invalid", "DependencyCycle", "spec.dependsOn[0]")
    assert adm.members == []


def test_task_keys_are_unique_dns_labels() -> None:
    adm = Admission(GroupLimits())
    adm.add([m("a")])
    refused(lambda: adm.add([m("a")]), "Conflict", "DuplicateTaskKey", "spec.taskKey")
    refused(lambda: adm.add([m("b"), m("b")]), "Invalid", "DuplicateTaskKey", "spec.taskKey")
    refused(lambda: adm.add([m("Bad_Key")]), "Invalid", "InvalidTaskKey", "spec.taskKey")
    refused(lambda: adm.add([Member("c", "g-c", D("0.1"), (), "Active")]), "Invalid", "InvalidState")
    assert [member.key for member in adm.members] == ["a"]


# -- the supervisor's side -------------------------------------------------------------------------


def test_a_run_is_handed_out_to_start_once() -> None:
    adm = Admission(GroupLimits(max_active=1))
    assert adm.add([m("a"), m("b")]).start == ["g-a"]
    assert adm.decide().start == [] and adm.unconfirmed == ["g-a"]
    assert states(adm)["a"] == ("Active", None)
    adm.started("g-a")
    adm.started("g-a")  # repeated acknowledgement: no-op
    assert adm.unconfirmed == []
    refused(lambda: adm.started("g-b"), "Conflict", "NotAdmitted")
    refused(lambda: adm.started("g-nope"), "Invalid", "UnknownRun")


def test_reports_are_checked_and_spend_never_goes_down() -> None:
    adm = Admission(GroupLimits())
    adm.add([m("a")])
    report(adm, "a", state="Active", spent="0.05")
    d = report(adm, "a", state="Active", spent="0.01")  # a stale report
    assert d.status.cost_total == D("0.05")
    refused(lambda: report(adm, "a", state="Queued"), "Invalid", "InvalidState", "status.phase")
    refused(lambda: adm.progressed("g-a", state="Active", spent=0.1), "Invalid", "InvalidAmount")  # type: ignore[arg-type]
    report(adm, "a", state="Succeeded", spent="0.06")
    refused(lambda: report(adm, "a", state="Failed"), "Conflict", "RunFinished")
    assert report(adm, "a", state="Succeeded", spent="0.07").status.cost_total == D("0.07")


def test_rebuild_keeps_reservations_and_admits_what_fits() -> None:
    members = [
        Member("a", "g-a", D("0.10"), (), "Active", None, D("0.04")),
        Member("b", "g-b", D("0.10"), ()),
        Member("c", "g-c", D("0.10"), ()),
    ]
    adm = Admission.rebuild(GroupLimits(max_cost=D("0.25")), members, sealed=False, cancelled=False)
    assert adm.status.reserved == D("0.06")
    d = adm.decide()
    assert d.start == ["g-b"] and adm.queued_reasons == {"g-c": "GroupWait"}
    assert d.status.blocked_reasons["MaxCostReached"] == 1


def test_rebuild_hands_out_the_cancels_a_restart_may_have_lost() -> None:
    members = [
        Member("a", "g-a", D("0.10"), (), "Active"),
        Member("b", "g-b", D("0.10"), (), "Succeeded"),
        Member("c", "g-c", D("0.10"), ("b",)),
    ]
    adm = Admission.rebuild(GroupLimits(), members, sealed=False, cancelled=True)
    d = adm.decide()
    assert d.cancel == [("g-a", "GroupCancelled"), ("g-c", "GroupCancelled")] and d.start == []
    assert d.status.phase == "Cancelling"
    assert adm.decide().cancel == []


def test_rebuild_accepts_members_out_of_dependency_order() -> None:
    members = [m("c", deps=["a"]), m("b"), m("a")]
    adm = Admission.rebuild(GroupLimits(max_active=1), members, sealed=False, cancelled=False)
    assert [member.key for member in adm.members] == ["b", "a", "c"]
    assert adm.decide().start == ["g-b"]
    refused(
        lambda: Admission.rebuild(GroupLimits(), [m("c", deps=["zz"])], sealed=False, cancelled=False),
        "Invalid",
        "UnknownDependency",
    )


def test_members_are_copies() -> None:
    adm = Admission(GroupLimits())
    batch = [m("a")]
    adm.add(batch)
    batch[0].state = "Succeeded"
    adm.members[0].state = "Failed"
    assert states(adm)["a"] == ("Active", None)


def test_status_to_dict_is_the_api_shape() -> None:
    adm = Admission(GroupLimits(max_active=1, max_cost=D("1.00")))
    adm.add([m("a"), m("b")])
    assert adm.status.to_dict() == {
        "phase": "Running",
        "reason": None,
        "message": None,
        "counts": {
            "queued": 1,
            "active": 1,
            "waiting": 0,
            "succeeded": 0,
            "failed": 0,
            "cancelled": 0,
            "total": 2,
        },
        "blockedReasons": {
            "DependencyWait": 0,
            "MaxActiveReached": 1,
            "MaxCostReached": 0,
            "NeedsResolution": 0,
        },
        "waitingReasons": {},
        "cost": {"totalUSD": "0", "limitUSD": "1.00", "reservedUSD": "0.10"},
    }
    assert Admission(GroupLimits()).status.to_dict()["cost"]["limitUSD"] is None


def test_refusals_survive_pickling() -> None:
    error = AdmissionError("Conflict", "GroupSealed", "sealed", field="spec.group", index=2)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.code, copy.reason, copy.message, copy.field, copy.index) == (
        "Conflict",
        "GroupSealed",
        "sealed",
        "spec.group",
        2,
    )
    assert copy.details == {"reason": "GroupSealed", "field": "spec.group", "index": 2}


# -- property test -----------------------------------------------------------------------------------


def reaches(batch: list[Member], start: Member, key: str) -> bool:
    """Whether ``start`` depends on ``key``, directly or through other members of ``batch``."""
    in_batch = {member.key: member for member in batch}
    seen, todo = set(), list(start.depends_on)
    while todo:
        dep = todo.pop()
        if dep == key:
            return True
        if dep not in seen and dep in in_batch:
            seen.add(dep)
            todo.extend(in_batch[dep].depends_on)
    return False


CAPS = [D("0"), D("0.05"), D("0.10"), D("0.25"), D("0.40")]
GROUP_CAPS = [None, D("0"), D("0.05"), D("0.10"), D("0.30"), D("0.60"), D("1.00")]
CENT = D("0.0001")


class AdmissionMachine(RuleBasedStateMachine):
    """Fake runs around one Admission: they do what they are told and report random outcomes."""

    def __init__(self) -> None:
        super().__init__()
        self.adm = Admission(GroupLimits())
        self.keys = 0
        self.ever_started: set[str] = set()
        self.told_to_cancel: set[str] = set()
        self.user_cancelled: set[str] = set()
        self.allowed_active = 0

    # -- helpers

    def by_run(self) -> dict[str, Member]:
        return {member.run: member for member in self.adm.members}

    def by_key(self) -> dict[str, Member]:
        return {member.key: member for member in self.adm.members}

    def busy(self) -> int:
        return sum(1 for member in self.adm.members if member.state in STARTED)

    def apply(self, decision: Decision) -> None:
        """Check a decision against the group as it stands, and let the fake runs act on it."""
        members, keys = self.by_run(), self.by_key()
        for run in decision.start:
            assert run not in self.ever_started, f"{run} started twice"
            assert all(keys[dep].state == "Succeeded" for dep in members[run].depends_on)
            self.ever_started.add(run)
        if decision.start:
            assert self.busy() <= self.adm.limits.max_active
        for run, reason in decision.cancel:
            member = members[run]
            dep_states = {keys[dep].state for dep in member.depends_on}
            if reason == "DependencyFailed":
                assert "Failed" in dep_states and member.state == "Cancelled"
            elif reason == "DependencyCancelled":
                assert (
                    "Cancelled" in dep_states and "Failed" not in dep_states and member.state == "Cancelled"
                )
            else:
                assert reason == "GroupCancelled" and self.adm.cancelled
                if member.state in STARTED:
                    self.told_to_cancel.add(run)
        assert decision.status == self.adm.status

    # -- rules

    @initialize(
        max_active=st.integers(1, 4),
        max_pending=st.sampled_from([2, 5, 20, 100]),
        max_cost=st.sampled_from(GROUP_CAPS),
    )
    def create(self, max_active: int, max_pending: int, max_cost: Decimal | None) -> None:
        self.adm = Admission(GroupLimits(max_active=max_active, max_pending=max_pending, max_cost=max_cost))
        self.allowed_active = max_active
        self.apply(self.adm.decide())

    @rule(data=st.data())
    def add_batch(self, data: st.DataObject) -> None:
        existing = [member.key for member in self.adm.members]
        size = data.draw(st.integers(1, 4), label="size")
        batch: list[Member] = []
        for _ in range(size):
            key = f"k{self.keys}"
            self.keys += 1
            earlier = existing + [member.key for member in batch]
            deps = data.draw(st.lists(st.sampled_from(earlier), max_size=2), label="deps") if earlier else []
            batch.append(Member(key, f"g-{key}", data.draw(st.sampled_from(CAPS), label="cap"), tuple(deps)))
        flaw = data.draw(st.sampled_from([None] * 6 + ["unknown", "self", "duplicate", "forward", "cycle"]))
        expected: str | None = None
        if flaw == "unknown":
            batch[-1].depends_on += ("missing",)
            expected = "UnknownDependency"
        elif flaw == "self":
            batch[0].depends_on += (batch[0].key,)
            expected = "DependencyCycle"
        elif flaw == "duplicate" and (existing or len(batch) > 1):
            batch[-1].key = existing[0] if existing else batch[0].key
            expected = "DuplicateTaskKey"
        elif flaw in ("forward", "cycle") and len(batch) > 1:
            batch[0].depends_on += (batch[-1].key,)
            if flaw == "cycle":
                batch[-1].depends_on += (batch[0].key,)
            expected = (
                "DependencyCycle"
                if flaw == "cycle" or reaches(batch, batch[-1], batch[0].key)
                else ("UnknownDependency")
            )
        unfinished = sum(1 for member in self.adm.members if member.state not in TERMINAL)
        if self.adm.cancelled:
            expected = "GroupCancelled"
        elif self.adm.sealed:
            expected = "GroupSealed"
        elif unfinished + len(batch) > self.adm.limits.max_pending:
            expected = "MaxPendingReached"
        before = (self.adm.members, self.adm.status, self.adm.unconfirmed)
        if expected is None:
            self.apply(self.adm.add(batch))
        else:
            with pytest.raises(AdmissionError) as caught:
                self.adm.add(batch)
            assert caught.value.reason == expected, caught.value.message
            assert (self.adm.members, self.adm.status, self.adm.unconfirmed) == before

    @rule(data=st.data())
    def run_reports(self, data: st.DataObject) -> None:
        started = [member for member in self.adm.members if member.state in STARTED]
        if not started:
            return
        member = data.draw(st.sampled_from(started), label="run")
        choices = ["Active", "Waiting", "Succeeded", "Failed", "Cancelled"]
        if member.run in self.told_to_cancel:
            choices = ["Cancelled", "Cancelled", "Succeeded", "Active"]
        state = data.draw(st.sampled_from(choices), label="state")
        quarter = data.draw(st.integers(0, 4), label="quarters of the rest")
        spent = (member.spent + (member.cap - member.spent) * quarter / 4).quantize(CENT, rounding=ROUND_DOWN)
        if state == "Cancelled" and member.run not in self.told_to_cancel:
            self.user_cancelled.add(member.run)
        self.apply(self.adm.progressed(member.run, state=state, spent=spent))
        if data.draw(st.booleans(), label="stale report") and state in STARTED:
            self.apply(self.adm.progressed(member.run, state=state, spent=member.spent))
            assert self.by_run()[member.run].spent == spent

    @rule(data=st.data())
    def another_run_reports(self, data: st.DataObject) -> None:
        """Runs report often; a second rule makes it twice as likely to be picked."""
        self.run_reports(data)

    @rule(data=st.data())
    def user_cancels_a_queued_run(self, data: st.DataObject) -> None:
        queued = [member for member in self.adm.members if member.state == "Queued"]
        if queued and data.draw(st.integers(0, 3), label="rarely") == 0:
            member = data.draw(st.sampled_from(queued), label="queued run")
            self.user_cancelled.add(member.run)
            self.apply(self.adm.progressed(member.run, state="Cancelled", spent=D(0)))

    @rule()
    def confirm_starts(self) -> None:
        for run in self.adm.unconfirmed:
            self.adm.started(run)
        assert self.adm.unconfirmed == []

    @rule(max_active=st.integers(1, 5))
    def patch_max_active(self, max_active: int) -> None:
        self.allowed_active = max(max_active, self.busy())
        self.apply(self.adm.patch(max_active=max_active))

    @rule(change=st.sampled_from([D("-0.05"), D("0"), D("0.05"), D("0.10"), D("0.50")]))
    def patch_max_cost(self, change: Decimal) -> None:
        current = self.adm.limits.max_cost
        if current is None or current + change < current:
            target = D("1") if current is None else current + change
            if target < 0:
                return
            before = (self.adm.members, self.adm.status)
            with pytest.raises(AdmissionError) as caught:
                self.adm.patch(max_cost=target)
            assert (caught.value.code, caught.value.reason) == ("Conflict", "CapLowered")
            assert (self.adm.members, self.adm.status) == before
        else:
            self.apply(self.adm.patch(max_cost=current + change))

    @rule(max_pending=st.integers(1, 30))
    def patch_max_pending(self, max_pending: int) -> None:
        self.apply(self.adm.patch(max_pending=max_pending))

    @rule(data=st.data())
    def add_more(self, data: st.DataObject) -> None:
        """Adding is the common operation; a second rule makes it twice as likely to be picked."""
        self.add_batch(data)

    @rule(data=st.data())
    def seal_or_cancel(self, data: st.DataObject) -> None:
        """Sealing, cancelling or running to the end stop a group growing, so they come rarely."""
        choice = data.draw(st.sampled_from(["seal", "cancel", "run to the end"] + ["not yet"] * 5))
        if choice == "seal":
            self.seal()
        elif choice == "cancel":
            self.cancel()
        elif choice == "run to the end":
            self.run_to_the_end()

    def seal(self) -> None:
        self.apply(self.adm.seal())
        assert self.adm.sealed

    def cancel(self) -> None:
        finished = self.adm.sealed and all(member.state in TERMINAL for member in self.adm.members)
        phase = self.adm.status.phase
        self.apply(self.adm.cancel())
        if finished:
            assert self.adm.status.phase == phase
        else:
            assert self.adm.status.phase in ("Cancelling", "Cancelled")
            assert not any(member.state == "Queued" for member in self.adm.members)

    @rule()
    def restart(self) -> None:
        """The supervisor dies and a new one rebuilds admission from the runs' recorded states."""
        adm = self.adm
        self.adm = Admission.rebuild(adm.limits, adm.members, sealed=adm.sealed, cancelled=adm.cancelled)
        decision = self.adm.decide()
        assert decision.start == []  # the live object had already started everything that fits
        self.apply(decision)

    def run_to_the_end(self) -> None:
        """Seal, lift the limits and let every run finish; the group must reach a final phase."""
        self.apply(self.adm.seal())
        if self.adm.limits.max_cost is not None:
            self.apply(self.adm.patch(max_cost=self.adm.limits.max_cost + 100))
        self.apply(self.adm.patch(max_active=1000))
        for _ in range(len(self.adm.members) + 1):
            started = [member for member in self.adm.members if member.state in STARTED]
            if not started:
                break
            for member in started:
                state = "Cancelled" if member.run in self.told_to_cancel else "Succeeded"
                self.apply(self.adm.progressed(member.run, state=state, spent=member.cap))
        assert all(member.state in TERMINAL for member in self.adm.members)
        assert self.adm.status.phase in ("Succeeded", "Failed", "Cancelled")

    # -- invariants

    @invariant()
    def never_more_than_max_active(self) -> None:
        busy = self.busy()
        assert busy <= self.allowed_active, (busy, self.allowed_active)
        # Above the limit (after lowering it) the count may only fall.
        self.allowed_active = max(self.adm.limits.max_active, busy)

    @invariant()
    def the_group_never_spends_past_its_cap(self) -> None:
        status = self.adm.status
        members = self.adm.members
        assert status.cost_total == sum((member.spent for member in members), D(0))
        assert all(member.spent <= member.cap for member in members)
        if status.cost_limit is not None:
            assert status.cost_total + status.reserved <= status.cost_limit

    @invariant()
    def runs_start_only_after_their_dependencies_succeed(self) -> None:
        keys = self.by_key()
        for member in self.adm.members:
            if member.state in STARTED or member.run in self.ever_started:
                assert all(keys[dep].state == "Succeeded" for dep in member.depends_on)
            if member.state in STARTED:
                assert member.run in self.ever_started

    @invariant()
    def failed_and_cancelled_dependencies_cancel_their_dependents(self) -> None:
        keys = self.by_key()
        for member in self.adm.members:
            dep_states = {keys[dep].state for dep in member.depends_on}
            if dep_states & {"Failed", "Cancelled"}:
                assert member.state != "Queued"
            if member.state == "Cancelled" and member.run not in self.ever_started | self.user_cancelled:
                assert member.reason in ("DependencyFailed", "DependencyCancelled", "GroupCancelled")
                if member.reason == "DependencyFailed":
                    assert "Failed" in dep_states
                if member.reason == "DependencyCancelled":
                    assert "Cancelled" in dep_states
                if member.reason == "GroupCancelled":
                    assert self.adm.cancelled

    @invariant()
    def the_phase_follows_the_members(self) -> None:
        status, members = self.adm.status, self.adm.members
        assert (
            sum(v for k, v in status.counts.items() if k != "total") == status.counts["total"] == len(members)
        )
        unfinished = [member for member in members if member.state not in TERMINAL]
        if self.adm.cancelled:
            assert status.phase == ("Cancelling" if unfinished else "Cancelled")
        elif self.adm.sealed and not unfinished:
            failed = any(
                member.state == "Failed"
                or (member.state == "Cancelled" and member.reason == "DependencyFailed")
                for member in members
            )
            assert (status.phase, status.reason) == (
                ("Failed", "RunsFailed") if failed else ("Succeeded", None)
            )
        else:
            assert status.phase == "Running"

    @invariant()
    def queued_runs_say_why_and_nothing_startable_is_left_waiting(self) -> None:
        adm, keys = self.adm, self.by_key()
        status = adm.status
        queued = [member for member in adm.members if member.state == "Queued"]
        assert sum(status.blocked_reasons.values()) == len(queued)
        assert adm.queued_reasons == {member.run: member.reason for member in queued}
        busy = self.busy()
        room = None if status.cost_limit is None else status.cost_limit - status.cost_total - status.reserved
        for member in queued:
            waits = any(keys[dep].state != "Succeeded" for dep in member.depends_on)
            assert member.reason == ("DependencyWait" if waits else "GroupWait")
            if not waits:
                # Work-conserving: an eligible run waits only for a slot or for room under the cap.
                assert busy >= adm.limits.max_active or (room is not None and member.cap > room)
        if (
            not adm.cancelled
            and busy == 0
            and status.blocked_reasons["MaxCostReached"]
            and status.phase == "Running"
        ):
            assert status.message is not None and "raise the cap" in status.message

    @invariant()
    def a_rebuild_gives_the_same_status(self) -> None:
        adm = self.adm
        rebuilt = Admission.rebuild(adm.limits, adm.members, sealed=adm.sealed, cancelled=adm.cancelled)
        assert rebuilt.status == adm.status
        decision = rebuilt.decide()
        assert decision.start == [] and decision.status == adm.status
        assert rebuilt.members == adm.members
        started_unfinished = {member.run for member in adm.members if member.state in STARTED}
        assert all(
            reason == "GroupCancelled" and run in started_unfinished for run, reason in decision.cancel
        )
        assert isinstance(decision.status, GroupStatus)


TestAdmissionProperties = AdmissionMachine.TestCase
TestAdmissionProperties.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
