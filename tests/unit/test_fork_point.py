"""Where a fork starts (`control.fork_point`): the step named, the boundary, the prefix kept."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from nodus.errors import Invalid
from nodus_ray.control.fork_point import fork_point, free_of_charge
from nodus_ray.durable.journal import JournalRecord, step_views

_AT = datetime(2026, 12, 3, tzinfo=UTC)


class _Log:
    """A journal as a run's actor writes it, seq by seq."""

    def __init__(self) -> None:
        self.records: list[JournalRecord] = []

    def add(self, step: str, kind: str, state: str, payload: Any = None, cost: str = "0") -> int:
        seq = len(self.records)
        self.records.append(JournalRecord(seq, step, kind, state, 1, payload, cost, _AT))
        return seq

    def step(
        self, step: str, kind: str, result: dict[str, Any], *, started: bool = True, cost: str = "0"
    ) -> None:
        if started:
            self.add(step, kind, "Started", {})
        self.add(step, kind, "Completed", {"result": result, "summary": step}, cost)


def _claude_run(turns: int = 1) -> _Log:
    """sandbox; per turn: (its message), route, model-1, command-1-1, command-1-2, model-2."""
    log = _Log()
    log.step("sandbox", "sandbox", {"backend": "bubblewrap"})
    for turn in range(1, turns + 1):
        if turn == 1:
            log.add("message-0", "message", "Completed", {"role": "user", "content": "hi"})
        else:
            log.step(f"turn-{turn}/message", "inbox", {"seq": turn - 1, "payload": "more"}, started=False)
        log.step(
            f"turn-{turn}/route",
            "route",
            {"family": "haiku", "billedUSD": "0.0001"},
            started=False,
            cost="0.0001",
        )
        log.step(f"turn-{turn}/model-1", "model", {"billedUSD": "0.01"}, cost="0.01")
        log.step(f"turn-{turn}/command-1-1", "command", {"exit_code": 0, "sandboxUSD": "0.002"})
        log.step(f"turn-{turn}/command-1-2", "command", {"exit_code": 0, "sandboxUSD": "0.002"})
        log.step(f"turn-{turn}/model-2", "model", {"billedUSD": "0.01"}, cost="0.01")
    return log


def test_at_names_a_step_by_its_row_or_its_id_and_keeps_the_steps_before_it() -> None:
    log = _claude_run()
    ids = [view["id"] for view in step_views(log.records)]
    assert ids[3] == "turn-1/command-1-1"
    by_number = fork_point(log.records, "4")
    by_id = fork_point(log.records, "turn-1/command-1-1")
    assert by_number == by_id
    assert (by_number.step, by_number.number) == ("turn-1/command-1-1", 4)
    kept = {record.step_id for record in by_number.records}
    assert kept == {"sandbox", "message-0", "turn-1/route", "turn-1/model-1"}, "before step 4, and none of it"
    assert by_number.boundary_seq == step_views(log.records)[3]["seq"]
    assert [r.seq for r in by_number.records] == list(range(by_number.boundary_seq)), "a prefix, in order"


def test_the_copied_records_cost_the_fork_nothing() -> None:
    point = fork_point(_claude_run().records, "turn-1/model-2")
    assert all(record.cost_usd == "0" for record in point.records)
    results = [r.payload["result"] for r in point.records if r.state == "Completed" and "result" in r.payload]
    assert {r.get("billedUSD", "0") for r in results} == {"0"}
    assert {r.get("sandboxUSD", "0") for r in results} == {"0"}
    assert [
        r.payload["result"]["exit_code"]
        for r in point.records
        if r.kind == "command" and r.state == "Completed"
    ] == [0, 0]
    original = JournalRecord(3, "s", "model", "Completed", 1, {"result": {"billedUSD": "1.5"}}, "1.5", _AT)
    assert free_of_charge(original).payload == {"result": {"billedUSD": "0"}}
    assert original.payload == {"result": {"billedUSD": "1.5"}}, "the original's record is not changed"


@pytest.mark.parametrize("at", ["0", "99", "turn-9/model-1", "message-0", "  "])
def test_a_step_that_does_not_exist_is_refused_naming_the_field(at: str) -> None:
    with pytest.raises(Invalid) as refused:
        fork_point(_claude_run().records, at)
    assert refused.value.details["field"] == "at"
    assert "does not exist" in refused.value.message or "required" in refused.value.message


def test_a_step_inside_another_that_has_not_ended_is_not_a_step_boundary() -> None:
    log = _Log()
    log.add("fetch", "step", "Started", {})
    log.step("fetch/model-1", "model", {"billedUSD": "0.01"})
    log.add("fetch", "step", "Completed", {"result": {}})
    log.step("report", "step", {})
    with pytest.raises(Invalid, match="not a step boundary: step fetch began before it and ended after"):
        fork_point(log.records, "fetch/model-1")
    assert fork_point(log.records, "report").number == 3, "after the outer step ended: a boundary"


def test_a_step_after_one_whose_outcome_is_unknown_is_not_a_step_boundary() -> None:
    log = _Log()
    log.step("sandbox", "sandbox", {})
    log.add("turn-1/command-1-1", "command", "Started", {})
    log.add("turn-1/command-1-1", "command", "NeedsResolution", {})
    log.step("later", "step", {})
    with pytest.raises(
        Invalid, match=r"step turn-1/command-1-1 before it has not ended there \(NeedsResolution\)"
    ):
        fork_point(log.records, "later")
    assert fork_point(log.records, "turn-1/command-1-1").records[-1].step_id == "sandbox", "before it: fine"


def test_a_new_prompt_keeps_no_step() -> None:
    log = _claude_run()
    for at in ("1", "sandbox", "turn-1/route"):
        point = fork_point(log.records, at, has_input=True)
        assert (point.records, point.replaces) == ((), "prompt")


def test_a_new_message_keeps_the_turns_before_it_and_the_messages_they_read() -> None:
    log = _claude_run(turns=3)
    for at in ("turn-3/message", "turn-3/route"):
        point = fork_point(log.records, at, has_input=True, keep_alive=True)
        assert point.replaces == "message"
        assert point.records[-1].step_id == "turn-2/model-2"
        assert point.read_seq == 1, "turn 2 read message 1; the new input is the next"
    without = fork_point(log.records, "turn-3/route", keep_alive=True)
    assert without.records[-1].step_id == "turn-3/message", "without --input, turn 3's message is kept"
    assert without.read_seq == 2 and without.replaces is None


def test_input_where_no_user_input_is_read_is_refused() -> None:
    log = _claude_run()
    with pytest.raises(Invalid, match="--input replaces a user message, and step 4"):
        fork_point(log.records, "4", has_input=True)
    with pytest.raises(Invalid, match="a Python program reads its input once"):
        fork_point(log.records, "2", has_input=True, program=True)
    assert fork_point(log.records, "1", has_input=True, program=True).replaces == "prompt"


def test_a_running_runs_journal_forks_at_a_boundary_it_already_holds() -> None:
    log = _claude_run()
    log.add("turn-1/command-2-1", "command", "Started", {})  # going on now
    point = fork_point(log.records, "turn-1/command-2-1")
    assert point.records[-1].step_id == "turn-1/model-2", "the step going on is not copied"
