"""Keep-alive group members and session keys (decision 48).

Admission first (pure): a keep-alive member waiting for a message holds its cost reservation
but no maxActive slot, a message makes it wait (Waiting / GroupWait) for a free slot, and it is
resumed before any queued run; the group's cap holds throughout. Then the control plane over
real local storage with fake actors: a message to a waiting member, `start_member` resuming it,
and sessions (one live run per project, agent and key; a finished run frees the key;
concurrent submits create one run; bad keys refused naming the field; the index survives a
restart). Then the SDK and the CLI sending ``sessionKey``.
"""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import nodus
from nodus import errors
from nodus.client import Client
from nodus.config import Settings
from nodus.errors import Conflict, Invalid
from nodus.resources import parse_resource, parse_run_list
from nodus_ray.core.admission import Admission, GroupLimits, Member
from tests.unit.test_control_support import Plane, agent_doc, group_doc, make_plane, run_doc, until

D = Decimal


def member(key: str, cap: str = "0.10") -> Member:
    return Member(key=key, run=f"g-{key}", cap=D(cap))


# -- admission ---------------------------------------------------------------------------------


def test_a_member_waiting_for_a_message_gives_its_slot_back_but_keeps_its_reservation() -> None:
    adm = Admission(GroupLimits(max_active=1, max_cost=D("1.00")))
    assert adm.add([member("a", "0.50"), member("b", "0.30")]).start == ["g-a"]
    d = adm.progressed("g-a", state="Waiting", spent=D("0.20"), reason="AwaitingMessage")
    assert d.start == ["g-b"]  # a's slot is free: b starts
    assert d.status.counts["waiting"] == 1 and d.status.counts["active"] == 1
    # a may still spend 0.30 when its next message comes, so that stays reserved with b's cap.
    assert d.status.reserved == D("0.60")
    assert d.status.waiting_reasons == {"AwaitingMessage": 1}


def test_a_message_waits_for_a_free_slot_and_goes_before_queued_runs() -> None:
    adm = Admission(GroupLimits(max_active=1))
    adm.add([member("a"), member("b"), member("c")])
    assert adm.progressed("g-a", state="Waiting", spent=D(0), reason="AwaitingMessage").start == ["g-b"]
    # A message came to a while b works: a waits for the slot (GroupWait), nothing starts.
    d = adm.progressed("g-a", state="Waiting", spent=D(0), reason="GroupWait")
    assert d.start == [] and d.status.waiting_reasons == {"GroupWait": 1}
    # b finishes: the slot goes to a (the conversation goes on) before c (new work).
    d = adm.progressed("g-b", state="Succeeded", spent=D(0))
    assert d.start == ["g-a"]
    assert {m.run: m.state for m in adm.members} == {"g-a": "Active", "g-b": "Succeeded", "g-c": "Queued"}
    adm.started("g-a")
    assert adm.progressed("g-a", state="Active", spent=D(0)).start == []  # its own report: no change
    assert adm.progressed("g-a", state="Waiting", spent=D(0), reason="AwaitingMessage").start == ["g-c"]


def test_the_group_cap_holds_while_keep_alive_members_wait() -> None:
    """Waiting members keep what they may still spend reserved: nothing starts past the cap."""
    adm = Admission(GroupLimits(max_active=5, max_cost=D("0.30")))
    assert adm.add([member(k) for k in "abcd"]).start == ["g-a", "g-b", "g-c"]
    for run, spent in (("g-a", "0"), ("g-b", "0.02"), ("g-c", "0.04")):
        d = adm.progressed(run, state="Waiting", spent=D(spent), reason="AwaitingMessage")
        assert d.start == [] and d.status.cost_total + d.status.reserved <= D("0.30")
    assert d.status.blocked_reasons["MaxCostReached"] == 1
    assert (d.status.cost_total, d.status.reserved) == (D("0.06"), D("0.24"))
    assert "and its waiting keep-alive runs hold $0.24" in (d.status.message or "")
    # A cancelled waiting member frees what it held (a's whole cap): room for d's cap, no more.
    d = adm.progressed("g-a", state="Cancelled", spent=D(0))
    assert d.start == ["g-d"] and d.status.cost_total + d.status.reserved == D("0.30")


def test_a_rebuilt_admission_resumes_a_member_a_message_came_to() -> None:
    members = [
        Member("a", "g-a", D("0.10"), state="Waiting", reason="GroupWait", spent=D("0.01")),
        Member("b", "g-b", D("0.10"), state="Active"),
        Member("c", "g-c", D("0.10")),
    ]
    adm = Admission.rebuild(GroupLimits(max_active=2), members, sealed=False, cancelled=False)
    assert adm.decide().start == ["g-a"]  # b holds one slot, a takes the other before c


def test_a_sealed_group_with_waiting_keep_alive_members_stays_running_until_they_end() -> None:
    adm = Admission(GroupLimits(max_active=2))
    adm.add([member("a"), member("b")])
    adm.progressed("g-a", state="Waiting", spent=D(0), reason="AwaitingMessage")
    adm.progressed("g-b", state="Succeeded", spent=D(0))
    d = adm.seal()
    assert d.status.phase == "Running"
    assert d.status.message == (
        "1 keep-alive run waits for a message; the group finishes once they end: send them "
        "messages, cancel them, or let their deadline pass"
    )
    d = adm.progressed("g-a", state="Failed", spent=D(0), reason="DeadlineExceeded")
    assert d.status.phase == "Failed"  # its deadline passed: a failed run fails the group
    other = Admission(GroupLimits())
    other.add([member("a")])
    other.progressed("g-a", state="Waiting", spent=D(0), reason="AwaitingMessage")
    other.seal()
    assert other.cancel().cancel == [("g-a", "GroupCancelled")]  # a group cancel ends them


def test_a_cancelled_group_resumes_nobody() -> None:
    adm = Admission(GroupLimits(max_active=1))
    adm.add([member("a")])
    adm.progressed("g-a", state="Waiting", spent=D(0), reason="AwaitingMessage")
    adm.cancel()
    assert adm.progressed("g-a", state="Waiting", spent=D(0), reason="GroupWait").start == []


# -- the schema --------------------------------------------------------------------------------


def _run(spec: dict[str, Any], name: str | None = "r") -> dict[str, Any]:
    metadata = {} if name is None else {"name": name}
    return {"apiVersion": "nodus.dev/v1", "kind": "AgentRun", "metadata": metadata, "spec": spec}


def test_a_group_member_may_be_keep_alive_but_holds_no_session() -> None:
    parsed = parse_resource(_run({"agent": "w", "group": "g", "taskKey": "a", "keepAlive": True}, None))
    assert parsed.spec.keepAlive is True  # type: ignore[union-attr]
    with pytest.raises(Invalid) as refused:
        parse_resource(_run({"agent": "w", "group": "g", "taskKey": "a", "sessionKey": "s"}, None))
    assert refused.value.details["field"] == "spec.sessionKey"


@pytest.mark.parametrize("key", ["Not A Label", "UPPER", "-dash", "a" * 64, "", "a_b", 5])
def test_a_session_key_that_is_not_a_dns_label_is_refused_naming_it(key: Any) -> None:
    with pytest.raises(Invalid) as refused:
        parse_resource(_run({"agent": "w", "sessionKey": key}))
    assert refused.value.details["field"] == "spec.sessionKey"


def test_a_batch_takes_no_session_runs() -> None:
    batch = {
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentRunList",
        "items": [_run({"agent": "w", "sessionKey": "s"})],
    }
    with pytest.raises(Invalid) as refused:
        parse_run_list(batch)
    assert refused.value.details["field"] == "items[0].spec.sessionKey"


# -- the control plane: keep-alive members ----------------------------------------------------


async def _group_with_member(tmp_path: Path) -> Plane:
    plane = await make_plane(tmp_path)
    await plane.services.agents.apply_agent("demo", agent_doc())
    await plane.services.groups.apply_group("demo", group_doc("g", limits={"maxActive": 1}))
    member_doc = run_doc("g-a", group="g", taskKey="a", keepAlive=True)
    await plane.services.runs.create_run("demo", member_doc)
    assert await plane.services.group_link.start_member("demo", "g-a")  # admitted (the fake admits nothing)
    return plane


def test_a_message_to_a_waiting_member_waits_for_its_group_then_resumes_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await _group_with_member(tmp_path)
        (first,) = await until(lambda: plane.run_actors.of("g-a"), what="the member's actor")
        first.end({"phase": "Waiting", "reason": "AwaitingMessage"})
        supervisor = plane.group_actors.supervisors[("demo", "g")]
        await until(
            lambda: ("g-a", "Waiting", "0", "AwaitingMessage") in supervisor.called("progressed"),
            what="the group told that its member waits for a message",
        )

        receipt = await plane.services.messages.send_message("demo", "g-a", "and now?")
        assert receipt["duplicate"] is False
        stored = plane.storage.read_json("projects/demo/agentruns/g-a/run.json")["status"]
        assert (stored["phase"], stored["reason"]) == ("Waiting", "GroupWait")
        assert "group 'g' has a free place" in stored["message"]
        assert ("g-a", "Waiting", "0", "GroupWait") in supervisor.called("progressed")
        assert len(plane.run_actors.of("g-a")) == 1  # no actor until its group gives it a slot

        restarted = await plane.restart()  # survives a restart: still waiting for the group
        assert restarted.phase("g-a") == "Waiting"
        snapshot = await restarted.services.group_link.group_snapshot("demo", "g")
        (wire,) = snapshot["members"]
        assert (wire.state, wire.reason) == ("Waiting", "GroupWait")

        assert await restarted.services.group_link.start_member("demo", "g-a")  # the supervisor resumes it
        stored = restarted.storage.read_json("projects/demo/agentruns/g-a/run.json")["status"]
        assert (stored["phase"], stored["message"]) == ("Running", "a message arrived")
        await until(lambda: plane.run_actors.of("g-a")[1:], what="a new actor for the resumed member")

    asyncio.run(scenario())


def test_a_restart_between_a_message_and_its_wake_up_asks_the_group(tmp_path: Path) -> None:
    """The message was stored and the run not moved on: recovery hands it to its group."""

    async def scenario() -> None:
        plane = await _group_with_member(tmp_path)
        (first,) = await until(lambda: plane.run_actors.of("g-a"), what="the member's actor")
        first.end({"phase": "Waiting", "reason": "AwaitingMessage", "messages": {"read": 0}})
        await until(lambda: plane.stored_phase("g-a") == "Waiting", what="the member parked")
        plane.storage.write_json(
            "projects/demo/agentruns/g-a/messages/00000001.json",
            {"seq": 1, "name": "message", "payload": "hi", "messageKey": None, "receivedAt": "x"},
        )
        restarted = await plane.restart()
        await until(
            lambda: restarted.services.registry.runs[("demo", "g-a")]["status"].get("reason") == "GroupWait",
            what="the member waiting for its group",
        )
        assert restarted.phase("g-a") == "Waiting" and len(plane.run_actors.of("g-a")) == 1

    asyncio.run(scenario())


# -- the control plane: sessions ----------------------------------------------------------------


def session_doc(name: str, key: str = "conv-1", text: str = "hello", **spec: Any) -> dict[str, Any]:
    return run_doc(name, input=text, sessionKey=key, **spec)


async def _plane_with_agent(tmp_path: Path) -> Plane:
    plane = await make_plane(tmp_path)
    await plane.services.agents.apply_agent("demo", agent_doc())
    await plane.services.agents.apply_agent("demo", agent_doc("other"))
    return plane


def _messages(plane: Plane, run: str) -> list[dict[str, Any]]:
    folder = f"projects/demo/agentruns/{run}/messages"
    return [plane.storage.read_json(f"{folder}/{entry}") for entry in plane.storage.list_dir(folder)]


def test_two_submits_with_one_key_reach_one_run_the_second_as_a_message(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await _plane_with_agent(tmp_path)
        sessions = plane.services.sessions
        first = await sessions.create_run("demo", session_doc("s-1", text="first"))
        assert first["result"] == "created"
        assert first["resource"]["spec"] == {
            "agent": "helper",
            "input": "first",
            "keepAlive": True,
            "sessionKey": "conv-1",
        }
        second = await sessions.create_run("demo", session_doc("s-2", text="second"))
        assert second["result"] == "delivered" and second["message"]["seq"] == 1
        assert second["resource"]["metadata"]["name"] == "s-1"
        assert ("demo", "s-2") not in plane.services.registry.runs
        assert [m["payload"] for m in _messages(plane, "s-1")] == ["second"]
        # The same submit again (its name: an idempotency key) is delivered once.
        again = await sessions.create_run("demo", session_doc("s-2", text="second"))
        assert again["result"] == "unchanged" and len(_messages(plane, "s-1")) == 1
        # ... and the first submit again is its run, unchanged.
        assert (await sessions.create_run("demo", session_doc("s-1", text="first")))["result"] == "unchanged"
        # One live run per project, agent and key: another agent's key is another session.
        other = await sessions.create_run("demo", session_doc("o-1", agent="other"))
        assert other["result"] == "created"
        assert sessions.holder("demo", "helper", "conv-1") == "s-1"
        assert sessions.holder("demo", "other", "conv-1") == "o-1"

    asyncio.run(scenario())


def test_a_finished_run_frees_its_key(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await _plane_with_agent(tmp_path)
        sessions = plane.services.sessions
        await sessions.create_run("demo", session_doc("s-1"))
        await plane.services.runs.cancel_run("demo", "s-1")
        assert sessions.holder("demo", "helper", "conv-1") is None
        second = await sessions.create_run("demo", session_doc("s-2", text="again"))
        assert second["result"] == "created" and second["resource"]["metadata"]["name"] == "s-2"
        assert _messages(plane, "s-1") == []
        # A run that ends by itself frees it too.
        (actor,) = await until(lambda: plane.run_actors.of("s-2"), what="the session run's actor")
        actor.end({"phase": "Failed", "reason": "ModelError", "message": "down"})
        await until(lambda: plane.phase("s-2") == "Failed", what="the run failed")
        assert (await sessions.create_run("demo", session_doc("s-3")))["result"] == "created"
        # A deleted one too.
        await plane.services.runs.delete_run("demo", "s-3")
        assert (await sessions.create_run("demo", session_doc("s-4")))["result"] == "created"

    asyncio.run(scenario())


def test_concurrent_submits_with_one_key_create_one_run(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await _plane_with_agent(tmp_path)
        sessions = plane.services.sessions
        answers = await asyncio.gather(
            *(sessions.create_run("demo", session_doc(f"s-{i}", text=f"m{i}")) for i in range(8))
        )
        results = [answer["result"] for answer in answers]
        assert results.count("created") == 1 and results.count("delivered") == 7
        holders = {answer["resource"]["metadata"]["name"] for answer in answers}
        assert len(holders) == 1
        (holder,) = holders
        assert [
            r for (p, r), run in plane.services.registry.runs.items() if run["spec"].get("sessionKey")
        ] == [holder]
        assert len(_messages(plane, holder)) == 7

    asyncio.run(scenario())


def test_bad_session_submits_are_refused_naming_the_field_and_change_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await _plane_with_agent(tmp_path)
        sessions = plane.services.sessions
        for bad in ("Conv 1", "conv_1", "x" * 64):
            with pytest.raises(Invalid) as refused:
                await sessions.create_run("demo", session_doc("s-1", key=bad))
            assert refused.value.details["field"] == "spec.sessionKey"
        with pytest.raises(Invalid) as not_alive:
            await sessions.create_run("demo", session_doc("s-1", keepAlive=False))
        assert not_alive.value.details["field"] == "spec.keepAlive"
        with pytest.raises(Invalid) as in_group:
            await plane.services.groups.apply_group("demo", group_doc("g"))
            await sessions.create_run("demo", session_doc("g-a", group="g", taskKey="a"))
        assert in_group.value.details["field"] == "spec.sessionKey"
        assert plane.services.registry.runs == {}
        # An unknown agent: NotFound, and the key stays free.
        with pytest.raises(errors.NotFound):
            await sessions.create_run("demo", session_doc("s-1", agent="nobody"))
        assert sessions.holder("demo", "nobody", "conv-1") is None

    asyncio.run(scenario())


def test_the_session_index_is_rebuilt_from_the_runs_after_a_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await _plane_with_agent(tmp_path)
        await plane.services.sessions.create_run("demo", session_doc("s-1"))
        await plane.services.sessions.create_run("demo", session_doc("old", key="gone"))
        await plane.services.runs.cancel_run("demo", "old")
        restarted = await plane.restart()
        sessions = restarted.services.sessions
        assert sessions.holder("demo", "helper", "conv-1") == "s-1"
        assert sessions.holder("demo", "helper", "gone") is None
        answer = await sessions.create_run("demo", session_doc("s-2", text="after the restart"))
        assert answer["result"] == "delivered" and answer["resource"]["metadata"]["name"] == "s-1"
        assert (await sessions.create_run("demo", session_doc("new", key="gone")))["result"] == "created"

    asyncio.run(scenario())


def test_a_plain_create_is_untouched_and_a_message_race_with_the_end_starts_a_new_run(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        plane = await _plane_with_agent(tmp_path)
        sessions = plane.services.sessions
        plain = await sessions.create_run("demo", run_doc("plain"))
        assert plain["result"] == "created" and "sessionKey" not in plain["resource"]["spec"]
        await sessions.create_run("demo", session_doc("s-1"))
        messages = plane.services.messages
        real = messages.send_message

        async def finished_meanwhile(*args: Any, **kwargs: Any) -> dict[str, Any]:
            await plane.services.runs.cancel_run("demo", "s-1")
            return await real(*args, **kwargs)

        messages.send_message = finished_meanwhile  # type: ignore[method-assign]
        answer = await sessions.create_run("demo", session_doc("s-2"))
        assert answer["result"] == "created" and answer["resource"]["metadata"]["name"] == "s-2"
        with pytest.raises(Conflict):
            await real("demo", "s-1", "late")  # AgentRunFinished: nothing was delivered to s-1
        assert _messages(plane, "s-1") == []

    asyncio.run(scenario())


# -- the SDK and the CLI -----------------------------------------------------------------------


class SessionAPI:
    """The one route a session submit uses: the first submit of a key creates, others deliver."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.holder: dict[str, Any] | None = None

    def handle(self, request: httpx.Request) -> httpx.Response:
        parts = request.url.path.strip("/").split("/")
        if parts[-2:] == ["agents", "helper"] or parts[-1] == "agents":
            agent = {
                "apiVersion": "nodus.dev/v1",
                "kind": "Agent",
                "metadata": {"name": "helper"},
                "spec": {},
            }
            return httpx.Response(200, json={**agent, "status": {"revision": 1}})
        assert (request.method, parts[-1]) == ("POST", "agentruns"), request.url.path
        body = json.loads(request.content)
        self.sent.append(body)
        if self.holder is None:
            self.holder = {**body, "status": {"phase": "Pending"}}
            return httpx.Response(201, json=self.holder, headers={"X-Nodus-Result": "created"})
        self.holder["status"]["messages"] = {"received": len(self.sent) - 1}
        return httpx.Response(
            202, json=self.holder, headers={"X-Nodus-Result": "delivered", "X-Nodus-Message-Seq": "1"}
        )

    def client(self) -> Client:
        settings = Settings(api_url="http://nodus.test")
        return Client(settings=settings, project="demo", transport=httpx.MockTransport(self.handle))


def test_submit_with_a_session_key_returns_the_run_holding_it_either_way() -> None:
    api = SessionAPI()
    agent = nodus.ClaudeAgent.from_name("helper", client=api.client())
    first = agent.submit("hello", session_key="conv-1")
    second = agent.submit("and then?", session_key="conv-1", idempotency_key="evt-2")
    assert first.name == second.name == api.sent[0]["metadata"]["name"]
    assert api.sent[0]["spec"] == {
        "agent": "helper",
        "input": "hello",
        "keepAlive": True,
        "sessionKey": "conv-1",
    }
    assert api.sent[1]["spec"]["input"] == "and then?"
    assert api.sent[1]["metadata"]["name"] != api.sent[0]["metadata"]["name"]  # from the idempotency key
    # wait() and answer() on the second handle wait for the answer to the message it delivered.
    assert (first._sent_seq, second._sent_seq) == (0, 1)


@pytest.mark.parametrize("key", ["Conv 1", "a_b", "x" * 64, 7])
def test_submit_refuses_a_bad_session_key_before_sending(key: Any) -> None:
    api = SessionAPI()
    agent = nodus.ClaudeAgent.from_name("helper", client=api.client())
    with pytest.raises(Invalid) as refused:
        agent.submit("hello", session_key=key)
    assert refused.value.details["field"] == "session_key"
    assert api.sent == []
    with pytest.raises(Invalid) as waits_forever:
        agent.remote("hello", session_key="conv-1")  # a session's run never finishes by itself
    assert waits_forever.value.details["field"] == "session_key"


def test_submit_many_sends_keep_alive_members() -> None:
    sent: list[dict[str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        parts = request.url.path.strip("/").split("/")
        if request.method == "GET" and parts[-2] == "agentgroups":
            group = {"metadata": {"name": "g", "uid": "u1"}, "spec": {"agent": "helper"}, "status": {}}
            return httpx.Response(200, json={"apiVersion": "nodus.dev/v1", "kind": "AgentGroup", **group})
        body = json.loads(request.content)
        sent.extend(body["items"])
        return httpx.Response(201, json={"items": body["items"], "replayed": False})

    client = Client(
        settings=Settings(api_url="http://nodus.test"), project="demo", transport=httpx.MockTransport(handle)
    )
    group = nodus.AgentGroup.from_name("g", client=client)
    group.submit_many([{"key": "a", "input": "hi", "keep_alive": True}, {"key": "b", "input": "yo"}])
    assert [item["spec"].get("keepAlive") for item in sent] == [True, None]
    with pytest.raises(Invalid) as refused:
        group.submit_many([{"key": "c", "keep_alive": "yes"}])
    assert refused.value.details["field"] == "tasks[0].keep_alive"


def test_cli_create_agentrun_with_a_session_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from nodus.cli import main as cli
    from nodus.cli import root as cli_root

    api = SessionAPI()
    monkeypatch.setattr(cli_root, "client", lambda project=None: api.client())
    runner = CliRunner()
    args = ["create", "agentrun", "--agent", "helper", "--session-key", "conv-1", "--prompt"]
    created = runner.invoke(cli.app, [*args, "hello"])
    assert created.exit_code == 0, created.output
    name = api.sent[0]["metadata"]["name"]
    assert created.stdout == f"agentrun/{name} created (session conv-1)\n"
    delivered = runner.invoke(cli.app, [*args, "more"])
    assert delivered.stdout == f"agentrun/{name}: message delivered (session conv-1)\n"
    assert api.sent[1]["spec"] == {
        "agent": "helper",
        "input": "more",
        "keepAlive": True,
        "sessionKey": "conv-1",
    }
    bad = runner.invoke(
        cli.app, ["create", "agentrun", "--agent", "helper", "--session-key", "Bad Key", "--prompt", "x"]
    )
    assert bad.exit_code == 1 and "spec.sessionKey" in bad.output and len(api.sent) == 2
    nameless = runner.invoke(cli.app, ["create", "agentrun", "--agent", "helper", "--prompt", "x"])
    assert nameless.exit_code != 0 and len(api.sent) == 2
