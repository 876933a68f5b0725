"""Which runs wait for a person and why: the group's counts and reasons, the CLI, the run's
message and the evidence (an interrupted command's connections, written as they happen)."""

from __future__ import annotations

import asyncio
from decimal import Decimal as D
from pathlib import Path
from typing import Any

from nodus.lifecycle import BlockedReason
from nodus_ray.core.admission import Admission, GroupLimits, Member
from nodus_ray.durable.journal import Journal
from nodus_ray.durable.steps import NeedsResolution, Steps
from nodus_ray.egress.proxy import EgressRecord
from nodus_ray.egress.run_egress import RunEgress, read_command_egress
from nodus_ray.runtime.waiting import command_evidence, connections_text, needs_resolution_message
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage
from tests.unit.test_cli_groups import GroupAPI, api, group, invoke  # noqa: F401 - api is a fixture
from tests.unit.test_control_support import agent_doc, group_doc, make_plane, run_doc, until

PREFIX = layout.run_prefix("demo", "r")


def _members(count: int) -> list[Member]:
    return [Member(key=f"t{i}", run=f"g-t{i}", cap=D("0.10")) for i in range(count)]


# -- the group's status -----------------------------------------------------------------------


def test_a_run_waiting_for_a_person_is_counted_and_named_until_it_is_resolved() -> None:
    adm = Admission(GroupLimits(max_active=2))
    adm.add(_members(3))
    adm.seal()
    status = adm.progressed("g-t0", state="Waiting", spent=D(0), reason="NeedsResolution").status
    assert status.counts["waiting"] == 1 and status.counts["active"] == 1
    assert status.blocked_reasons == {
        "DependencyWait": 0,
        "MaxActiveReached": 1,  # the waiting run keeps its slot
        "MaxCostReached": 0,
        "NeedsResolution": 1,
    }
    assert status.waiting_reasons == {"NeedsResolution": 1}
    adm.progressed("g-t1", state="Succeeded", spent=D(0))
    status = adm.progressed("g-t2", state="Succeeded", spent=D(0)).status
    # Nothing else is left: only a person moves the group on, and its message says so.
    assert status.phase == "Running" and status.counts["succeeded"] == 2
    assert status.message is not None and "1 run waits for a person" in status.message
    assert "nodus agentrun resolve" in status.message
    assert status.to_dict()["blockedReasons"]["NeedsResolution"] == 1
    assert status.to_dict()["waitingReasons"] == {"NeedsResolution": 1}
    # A restarted supervisor rebuilds the same status from the runs' recorded states.
    rebuilt = Admission.rebuild(adm.limits, adm.members, sealed=True, cancelled=False)
    assert rebuilt.status == status
    # Resolved: the run goes on (Active, no reason), then finishes, and so does the group.
    status = adm.progressed("g-t0", state="Active", spent=D(0)).status
    assert status.counts["waiting"] == 0 and status.blocked_reasons["NeedsResolution"] == 0
    assert status.waiting_reasons == {} and status.message is None
    assert adm.progressed("g-t0", state="Succeeded", spent=D(0)).status.phase == "Succeeded"


def test_other_waiting_reasons_are_split_out_but_do_not_count_as_blocked_for_a_person() -> None:
    adm = Admission(GroupLimits(max_active=5))
    adm.add(_members(4))
    adm.progressed("g-t0", state="Waiting", spent=D(0), reason="AwaitingMessage")
    adm.progressed("g-t1", state="Waiting", spent=D(0), reason="InsufficientCredits")
    adm.progressed("g-t2", state="Waiting", spent=D(0), reason="NeedsResolution")
    status = adm.progressed("g-t3", state="Waiting", spent=D("0.10"), reason="MaxCostReached").status
    assert status.counts["waiting"] == 4
    assert status.waiting_reasons == {
        "AwaitingMessage": 1,
        "InsufficientCredits": 1,
        "MaxCostReached": 1,
        "NeedsResolution": 1,
    }
    # blockedReasons' MaxCostReached stays the queued runs' (room under the group's cap).
    assert status.blocked_reasons["MaxCostReached"] == 0 and status.blocked_reasons["NeedsResolution"] == 1
    # A run whose reason changes while it waits moves between the reasons.
    status = adm.progressed("g-t0", state="Waiting", spent=D(0), reason="NeedsResolution").status
    assert status.waiting_reasons["NeedsResolution"] == 2 and "AwaitingMessage" not in status.waiting_reasons
    assert BlockedReason.NEEDS_RESOLUTION == "NeedsResolution"


def test_the_control_plane_tells_the_group_why_its_member_waits(tmp_path: Path) -> None:
    """A member parking NeedsResolution reaches its supervisor with the reason, and a restarted
    supervisor's snapshot carries it: the counts survive a restart."""

    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        link = plane.services.group_link
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.groups.apply_group("demo", group_doc("g"))
        await plane.services.runs.create_run("demo", run_doc("g-t1", group="g", taskKey="t1"))
        assert await link.start_member("demo", "g-t1") is True
        (actor,) = await until(lambda: plane.run_actors.of("g-t1"), what="the member's actor")
        await until(lambda: plane.phase("g-t1") == "Running", what="the member running")
        actor.end(
            {
                "phase": "Waiting",
                "reason": "NeedsResolution",
                "message": "step turn-1/tool-0 (command) was interrupted ...",
                "step": "turn-1/tool-0",
            }
        )
        await until(lambda: plane.phase("g-t1") == "Waiting", what="the member parked")
        supervisor = plane.group_actors.supervisors[("demo", "g")]
        await until(
            lambda: ("g-t1", "Waiting", "0", "NeedsResolution") in supervisor.called("progressed"),
            what="the report with its reason",
        )
        snapshot = await link.group_snapshot("demo", "g")
        members = [wire.member() for wire in snapshot["members"]]
        rebuilt = Admission.rebuild(GroupLimits(), members, sealed=False, cancelled=False)
        assert rebuilt.status.blocked_reasons["NeedsResolution"] == 1
        assert rebuilt.status.waiting_reasons == {"NeedsResolution": 1}

    asyncio.run(scenario())


# -- the CLI ---------------------------------------------------------------------------------

STUCK = {
    "message": "1 run waits for a person: ...",
    "counts": {
        "queued": 0,
        "active": 0,
        "waiting": 1,
        "succeeded": 5,
        "failed": 0,
        "cancelled": 0,
        "total": 6,
    },
    "blockedReasons": {"DependencyWait": 0, "MaxActiveReached": 0, "MaxCostReached": 0, "NeedsResolution": 1},
    "waitingReasons": {"NeedsResolution": 1},
}


def _waiting_run(name: str, group_name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"agent": "parallel-agents-worker", "group": group_name},
        "status": {
            "phase": "Waiting",
            "reason": "NeedsResolution",
            "step": "turn-1/tool-0",
            "message": "step turn-1/tool-0 (command) was interrupted; it made no connections",
        },
    }


def test_get_ag_has_a_waiting_column_and_wide_says_why(api: GroupAPI) -> None:  # noqa: F811
    api.put("agentgroups", group(**STUCK))
    lines = invoke("get", "ag").stdout.splitlines()
    headers = lines[0].split()
    assert headers[:7] == ["NAME", "AGENT", "PHASE", "RUNS", "ACTIVE", "WAITING", "QUEUED"]
    row = lines[1].split()
    assert row[3:7] == ["5/6", "0", "1", "0"]
    wide = invoke("get", "ag", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-2] == "BLOCKED" and wide[1].split()[-2] == "NeedsResolution=1"
    shown = invoke("get", "ag", "parallel-agents", "-o", "yaml").stdout
    assert "waiting: 1" in shown and "NeedsResolution: 1" in shown and "waitingReasons:" in shown


def test_describe_ag_lists_the_waiting_runs_with_their_reason_and_step(api: GroupAPI) -> None:  # noqa: F811
    api.put("agentgroups", group(**STUCK))
    api.put("agentruns", _waiting_run("parallel-agents-t3", "parallel-agents"))
    api.put("agentruns", {**_waiting_run("elsewhere", "other")})
    result = invoke("describe", "ag", "parallel-agents")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Blocked:   NeedsResolution=1" in out and "waiting 1" in out
    assert "1 run waits for a person" in out
    table = out.split("Waiting runs:\n", 1)[1].splitlines()
    assert table[0].split()[:3] == ["NAME", "REASON", "STEP"]
    assert table[1].split()[:3] == ["parallel-agents-t3", "NeedsResolution", "turn-1/tool-0"]
    assert "it made no connections" in table[1]
    assert len(table) == 2  # the other group's run is not listed
    refused = invoke("describe", "ar", "x")
    assert refused.exit_code == 2 and "agentgroup" in refused.stderr


# -- the evidence ----------------------------------------------------------------------------


def _record(host: str, outcome: str = "allowed", up: int = 0, down: int = 0) -> EgressRecord:
    return EgressRecord(
        host=host,
        port=443,
        outcome=outcome,
        reason=None if outcome == "allowed" else "HostNotAllowed",
        bytes_up=up,
        bytes_down=down,
        duration_seconds=0.5,
        started_at=f"2026-12-01T00:00:0{len(host) % 10}Z",
        method="CONNECT",
    )


def test_a_commands_connections_are_written_as_they_open_and_end(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path / "storage"))
    egress = RunEgress(["example.com"], "", storage=storage, run_prefix=PREFIX)
    assert read_command_egress(storage, PREFIX, 7) is None  # not begun: unknown
    egress.begin(7)
    assert read_command_egress(storage, PREFIX, 7) == []  # begun: known to be none yet
    assert connections_text(command_evidence(storage, PREFIX, 7)["egress"]) == "it made no connections"
    egress._opened(_record("example.com"))
    (open_one,) = read_command_egress(storage, PREFIX, 7) or []
    assert (open_one["host"], open_one["ended"]) == ("example.com", False)
    egress._record(_record("example.com", up=517, down=3200))
    egress._record(_record("evil.org", outcome="refused"))
    written = read_command_egress(storage, PREFIX, 7) or []
    assert [(c["host"], c["outcome"], c["ended"], c["bytesUp"]) for c in written] == [
        ("example.com", "allowed", True, 517),
        ("evil.org", "refused", True, 0),
    ]
    assert all("path" not in c and "headers" not in c for c in written)
    text = connections_text(command_evidence(storage, PREFIX, 7)["egress"])
    assert text.startswith("its 2 connections: example.com:443 allowed (517 B up, 3.1 kB down)")
    # The next command starts its own object; the first stays as it was.
    egress.begin(9)
    assert (
        read_command_egress(storage, PREFIX, 9) == []
        and len(read_command_egress(storage, PREFIX, 7) or []) == 2
    )
    # What the command's result journals (`take`) is unchanged: every ended record, once.
    assert [r["host"] for r in egress._records] == ["example.com", "evil.org"]
    missing = command_evidence(storage, PREFIX, 3)["egress"]
    assert missing == {"recorded": False, "connections": []}
    assert connections_text(missing) == "its connections were not recorded"


def test_the_needs_resolution_record_keeps_the_evidence(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path / "storage"))
    prefix = layout.journal_folder("demo", "r")

    async def scenario() -> None:
        journal = Journal(storage, prefix)
        await asyncio.to_thread(journal.load)
        steps = Steps(journal)
        started = await steps._append("turn-1/tool-0", "command", "Started", {"command": "x"}, attempt=1)
        replay = Steps(journal)

        async def never() -> dict[str, Any]:
            raise AssertionError("an interrupted external step is not run again by itself")

        asked: list[int] = []

        def evidence(record: Any) -> dict[str, Any]:
            asked.append(record.seq)
            return {"egress": {"recorded": True, "connections": []}}

        try:
            await replay.run("turn-1/tool-0", "command", never, effect="external", evidence_of=evidence)
        except NeedsResolution as parked:
            assert parked.evidence == {"egress": {"recorded": True, "connections": []}}
            message = needs_resolution_message(parked, "r", ["example.com"])
        else:
            raise AssertionError("the step should wait for a person")
        assert asked == [started.seq]
        assert "step turn-1/tool-0 (command) was interrupted" in message
        assert "allowedHosts: example.com" in message and "it made no connections" in message
        assert "nodus agentrun resolve r --step turn-1/tool-0" in message
        last = journal.records[-1]
        assert last.state == "NeedsResolution" and last.payload["egress"]["recorded"] is True
        # Replayed again (a new actor): the record's evidence comes back, not asked for twice.
        again = Steps(journal)
        try:
            await again.run("turn-1/tool-0", "command", never, effect="external", evidence_of=evidence)
        except NeedsResolution as parked:
            assert parked.evidence["egress"]["recorded"] is True
        assert asked == [started.seq]

    asyncio.run(scenario())


def test_a_batchs_progress_says_when_it_waits_for_a_person() -> None:
    """The issue's stalled batch: 5 of 6 done, nothing active or queued, one run waiting."""
    from nodus.batch import _progress

    rows = [{"key": f"t{i}", "phase": "Succeeded"} for i in range(5)] + [{"key": "t5", "phase": "Waiting"}]
    message = "1 run waits for a person: ... (`nodus agentrun resolve`)"
    progress = _progress(6, rows, {"counts": {"active": 0, "waiting": 1, "queued": 0}, "message": message})
    assert progress.line("g").endswith(f"waiting: {message}")
