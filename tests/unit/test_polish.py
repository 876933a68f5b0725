"""Issue 18's small things users notice (decision 49).

* BYOK takes any model name: the price table decides what Nodus bills, not which models a
  user's own key may call. Priced models show their list cost, unpriced ones say so, nothing is
  billed; Nodus access still refuses an unpriced model (`UnpricedModel`).
* Every CLI refusal is one line ``error: <Code>: <message>``, the code being the API's reason
  name, so a script can tell refusals apart.
* A step in progress says what it is doing (the command as journaled, redacted; the model) and,
  while the run is Running, for how long.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from nodus.cli import main as cli
from nodus.cli import root as cli_root
from nodus.cli.output import format_running, step_summary
from nodus.client import Client
from nodus.errors import Invalid
from nodus_ray.durable.journal import Journal, record_view, step_views
from nodus_ray.durable.step_activity import activity, running_time
from nodus_ray.models.catalog import family_of_model
from nodus_ray.money.billing import billed_cost, billed_worst_case, list_cost
from nodus_ray.money.prices import DEFAULT_PRICE_TABLE, UnpricedModel
from nodus_ray.runtime.list_costs import add_list_cost, list_cost_fields
from nodus_ray.runtime.turn_record import TurnRecord
from nodus_ray.store.storage import Storage
from tests.unit.test_control_support import agent_doc, make_plane
from tests.unit.test_conversation import USAGE, Rig, ScriptedProvider, bash, run, text

UNPRICED = "claude-sonnet-4-5"
PRICES = DEFAULT_PRICE_TABLE


# -- BYOK takes any model name ---------------------------------------------------------------


def test_byok_needs_no_price_and_nodus_still_refuses_an_unpriced_model() -> None:
    assert billed_worst_case(PRICES, "BYOK", UNPRICED, 10_000, 1024) == 0
    assert billed_cost(PRICES, "BYOK", UNPRICED, USAGE) == 0
    with pytest.raises(UnpricedModel):
        billed_worst_case(PRICES, "Nodus", UNPRICED, 10_000, 1024)
    with pytest.raises(UnpricedModel):
        billed_cost(PRICES, "Nodus", UNPRICED, USAGE)
    with pytest.raises(ValueError, match="access"):
        billed_worst_case(PRICES, "Free", "claude-haiku-5-5", 1, 1)
    # On a priced model BYOK is still free, and its list cost is the provider's price (no margin).
    assert billed_cost(PRICES, "BYOK", "claude-haiku-5-5", USAGE) == 0
    assert list_cost(PRICES, "claude-haiku-5-5", USAGE) == Decimal("0.0002")  # 100 * $1 + 20 * $5 per M
    assert list_cost(PRICES, UNPRICED, USAGE) is None


def test_a_byok_agent_may_name_any_model_a_nodus_agent_only_a_priced_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        agents = plane.services.agents
        byok = {"access": "BYOK", "apiKeySecret": "anthropic", "name": UNPRICED}
        created = await agents.apply_agent("demo", agent_doc("mine", model=byok), mode="create")
        assert created["resource"]["spec"]["model"]["name"] == UNPRICED
        with pytest.raises(Invalid) as refused:
            await agents.apply_agent("demo", agent_doc("theirs", model={"name": UNPRICED}))
        assert refused.value.code == "UnpricedModel"
        assert refused.value.details["field"] == "spec.model.name"
        # Switching the BYOK agent to Nodus access is refused too: the table prices Nodus calls.
        with pytest.raises(Invalid) as switched:
            await agents.patch_agent(
                "demo", "mine", {"spec": {"model": {"access": "Nodus", "apiKeySecret": None}}}
            )
        assert switched.value.code == "UnpricedModel"
        assert (await agents.get_agent("demo", "mine"))["spec"]["model"]["access"] == "BYOK"

    asyncio.run(scenario())


def test_the_family_of_a_pinned_model_never_fails() -> None:
    families = PRICES.family_models
    assert family_of_model("claude-haiku-5-5", families) == "haiku"
    assert family_of_model(UNPRICED, families) == "sonnet"  # named in its id
    assert family_of_model("Claude-Opus-4-1", families) == "opus"
    assert family_of_model("some-model", families) is None


def test_a_turns_list_cost_adds_up_and_an_unpriced_call_makes_it_unknown() -> None:
    turn = TurnRecord(index=1)
    add_list_cost(turn, PRICES, "BYOK", "claude-haiku-5-5", USAGE)
    add_list_cost(turn, PRICES, "BYOK", "claude-haiku-5-5", USAGE)
    assert turn.listCostUSD == "0.000400" and turn.unpricedModels is None
    assert list_cost_fields([turn], "BYOK") == {"listUSD": "0.000400", "listNote": None}
    other = TurnRecord(index=2)
    add_list_cost(other, PRICES, "BYOK", UNPRICED, USAGE)
    add_list_cost(other, PRICES, "BYOK", "claude-haiku-5-5", USAGE)  # unknown stays unknown
    assert other.listCostUSD is None and other.unpricedModels == [UNPRICED]
    fields = list_cost_fields([turn, other], "BYOK")
    assert fields["listUSD"] is None and UNPRICED in fields["listNote"] and "BYOK" in fields["listNote"]
    nodus = TurnRecord(index=1)
    add_list_cost(nodus, PRICES, "Nodus", "claude-haiku-5-5", USAGE)
    assert nodus.listCostUSD is None and list_cost_fields([nodus], "Nodus") == {}


@pytest.fixture
def rig(tmp_path: Path) -> Any:
    made = Rig(tmp_path)
    yield made
    if made.sandboxes:
        made.sandboxes[-1].delete()


def test_a_byok_run_pinned_to_an_unpriced_model_runs_and_bills_nothing(rig: Rig) -> None:
    provider = ScriptedProvider(bash("echo hi"), text("Done."))
    conversation = rig.conversation(provider, model_name=UNPRICED, access="BYOK", cap=None)
    assert run(conversation) == "Done."
    assert [request.model for request in provider.requests] == [UNPRICED, UNPRICED]
    [turn] = conversation.turns
    assert (turn.model, turn.family, turn.routing) == (UNPRICED, "sonnet", "pinned")
    assert turn.costUSD == "0" and conversation.cost_usd == 0
    assert turn.listCostUSD is None and turn.unpricedModels == [UNPRICED]
    assert list_cost_fields(conversation.turns, "BYOK")["listUSD"] is None
    # The model call's Started record names the model and its family: what `steps` shows while it runs.
    started = [r for r in rig.records() if r.kind == "model" and r.state == "Started"]
    assert started[0].payload["model"] == UNPRICED and started[0].payload["family"] == "sonnet"


def test_a_byok_run_on_a_priced_model_shows_its_list_cost(rig: Rig) -> None:
    provider = ScriptedProvider(text("Hello."))
    conversation = rig.conversation(provider, families=["haiku"], access="BYOK", cap=None)
    assert run(conversation) == "Hello."
    [turn] = conversation.turns
    assert turn.costUSD == "0"
    assert turn.listCostUSD == str(list_cost(PRICES, "claude-haiku-5-5", USAGE))
    assert list_cost_fields(conversation.turns, "BYOK") == {"listUSD": turn.listCostUSD, "listNote": None}


def test_a_nodus_run_refuses_an_unpriced_pinned_model_before_calling(rig: Rig) -> None:
    provider = ScriptedProvider()
    with pytest.raises(UnpricedModel):
        run(rig.conversation(provider, model_name=UNPRICED))
    assert provider.requests == []


def test_a_byok_runs_status_cost_carries_its_list_cost_a_nodus_runs_does_not(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from nodus.lifecycle import RunPhase
    from tests.unit.test_run_outcome import _actor

    turns = [TurnRecord(index=1, listCostUSD="0.000200"), TurnRecord(index=2, listCostUSD="0.000100")]
    conversation = SimpleNamespace(turns=turns, cost_usd=Decimal(0), sandbox_usd=Decimal(0))
    actor = _actor(tmp_path)
    nodus = actor._outcome(RunPhase.SUCCEEDED, "Completed", None, conversation, answer="4")  # type: ignore[arg-type]
    assert nodus.cost is not None and "listUSD" not in nodus.cost
    actor.config.agent_spec["model"] = {"access": "BYOK", "apiKeySecret": "k"}
    byok = actor._outcome(RunPhase.SUCCEEDED, "Completed", None, conversation, answer="4")  # type: ignore[arg-type]
    assert byok.cost is not None
    assert (byok.cost["totalUSD"], byok.cost["listUSD"], byok.cost["listNote"]) == ("0", "0.000300", None)


# -- a step in progress -----------------------------------------------------------------------


def _journal(tmp_path: Path) -> Journal:
    journal = Journal(Storage(str(tmp_path / "store")), "projects/p/agentruns/r/journal")
    journal.load()
    return journal


def test_a_started_step_says_what_it_does_and_since_when(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    journal.append("sandbox", "sandbox", "Completed", {"result": {}, "summary": "bubblewrap sandbox"})
    journal.append("turn-1/model-1", "model", "Started", {"model": "claude-haiku-5-5", "family": "haiku"})
    journal.append("turn-1/model-1", "model", "Completed", {"result": {}, "summary": "ok"})
    # The command is journaled redacted (`Conversation._command`); the view shows it as recorded.
    journal.append("turn-1/command-1-1", "command", "Started", {"command": "curl -H 'x: ***' example.org"})
    journal.append("turn-1/command-1-2", "command", "Started", {"command": "sleep 417"})
    journal.append("turn-1/command-1-2", "command", "Failed", {"error": {}})
    journal.append("turn-1/command-1-2", "command", "Started", {"command": "sleep 417"}, attempt=2)
    views = {view["id"]: view for view in step_views(journal.records)}
    assert views["turn-1/model-1"]["summary"] == "ok" and "runningSince" not in views["turn-1/model-1"]
    assert views["turn-1/command-1-1"]["summary"] == "$ curl -H 'x: ***' example.org"
    retried = views["turn-1/command-1-2"]
    assert retried["summary"] == "$ sleep 417" and retried["attempts"] == 2
    last_started = [r for r in journal.records if r.step_id == "turn-1/command-1-2"][-1]
    assert retried["runningSince"] == views["turn-1/command-1-2"]["runningSince"]
    assert retried["runningSince"].startswith(last_started.at.strftime("%Y-%m-%dT%H:%M:%S"))

    now = last_started.at + timedelta(seconds=12.7)
    timed = {view["id"]: view for view in running_time(list(views.values()), now)}
    assert timed["turn-1/command-1-2"]["runningSeconds"] == 12
    assert "runningSeconds" not in timed["turn-1/model-1"]


def test_the_events_stream_says_what_a_started_step_does(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    journal.append("turn-1/model-1", "model", "Started", {"model": "claude-haiku-5-5", "family": "haiku"})
    journal.append("turn-1/command-1-1", "command", "Started", {"command": "sleep 417"})
    journal.append(
        "turn-1/command-1-1", "command", "Completed", {"result": {}, "summary": "sleep 417 -> exit 0"}
    )
    shown = [(view["step"], view["state"], view["summary"]) for view in map(record_view, journal.records)]
    assert shown == [
        ("turn-1/model-1", "Started", "calling claude-haiku-5-5"),
        ("turn-1/command-1-1", "Started", "$ sleep 417"),
        ("turn-1/command-1-1", "Completed", "sleep 417 -> exit 0"),
    ]


def test_the_activity_of_each_kind() -> None:
    assert activity("command", "turn-1/command-1-1", {"command": "sleep  417\n"}) == "$ sleep 417"
    assert activity("model", "turn-1/model-1", {"model": "claude-sonnet-5-5", "family": "sonnet"}) == (
        "calling claude-sonnet-5-5"
    )
    assert activity("model", "m", {"model": "my-model", "family": "opus"}) == "calling my-model (opus)"
    assert activity("model", "model-3", {}) == "calling the model"  # a program's call, or expired payloads
    assert activity("step", "fetch-page-2", {"effect": "external"}) == "step fetch-page"
    assert (
        activity("sleep", "sleep-1", {"wakeAt": "2026-12-01T10:00:00Z"})
        == "sleeping until 2026-12-01T10:00:00Z"
    )
    assert (
        activity("inbox", "message/approval-1", {"message": "approval"}) == "waiting for message 'approval'"
    )
    assert activity("command", "c", {}) == "running a command"


def test_the_cli_says_how_long_a_step_has_run() -> None:
    assert [format_running(s) for s in (0, 12, 184, 7500)] == [
        "running 0s",
        "running 12s",
        "running 3m04s",
        "running 2h05m",
    ]
    step = {"state": "Started", "summary": "$ sleep 417", "runningSeconds": 12}
    assert step_summary(step) == "$ sleep 417 (running 12s)"
    assert step_summary({**step, "runningSeconds": None}) == "$ sleep 417"  # a parked run's step
    assert step_summary({"state": "Completed", "summary": "done", "runningSeconds": 3}) == "done"
    long = {**step, "summary": "$ " + "x" * 200}
    cell = step_summary(long, 80)
    assert len(cell) <= 80 and cell.endswith("(running 12s)")


def _steps_api(items: list[dict[str, Any]]) -> Client:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path.endswith("/agentruns/r/steps")
        return httpx.Response(200, json={"items": items})

    return Client("http://t", transport=httpx.MockTransport(handler))


def test_agentrun_steps_lists_a_running_command_with_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    since = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()
    items = [
        {"id": "sandbox", "kind": "sandbox", "state": "Completed", "attempts": 1, "summary": "made"},
        {
            "id": "turn-1/command-1-1",
            "kind": "command",
            "state": "Started",
            "attempts": 1,
            "summary": "$ sleep 417",
            "runningSince": since,
            "runningSeconds": 5,
        },
    ]
    client = _steps_api(items)
    monkeypatch.setattr(cli_root, "client", lambda project=None: client)
    result = CliRunner().invoke(cli.app, ["agentrun", "steps", "r"])
    assert result.exit_code == 0, result.output
    row = [line for line in result.stdout.splitlines() if "command-1-1" in line][0]
    assert "Started" in row and row.endswith("$ sleep 417 (running 5s)")


# -- CLI refusals carry their reason code -----------------------------------------------------


def _refusing(status: int, body: dict[str, Any]) -> Client:
    return Client(
        "http://t", transport=httpx.MockTransport(lambda request: httpx.Response(status, json=body))
    )


@pytest.mark.parametrize(
    ("status", "body", "line"),
    [
        (
            409,
            {
                "code": "AgentStopped",
                "message": "agent 'x' is stopped (spec.state: Stopped); it takes no runs",
                "details": {"field": "spec.state"},
            },
            "error: AgentStopped: agent 'x' is stopped (spec.state: Stopped); it takes no runs",
        ),
        (
            409,
            {"code": "AgentRunFinished", "message": "agentrun 'r' is Succeeded; it takes no messages"},
            "error: AgentRunFinished: agentrun 'r' is Succeeded; it takes no messages",
        ),
        (404, {"code": "NotFound", "message": "agent 'x' not found"}, "error: NotFound: agent 'x' not found"),
        (
            422,
            {
                "code": "Invalid",
                "message": "spec.maxTokens: must be >= 1",
                "details": {"field": "spec.maxTokens"},
            },
            "error: Invalid: spec.maxTokens: must be >= 1",
        ),
        (
            422,
            {"code": "Invalid", "message": "must be >= 1", "details": {"field": "spec.maxTokens"}},
            "error: Invalid: must be >= 1 (field: spec.maxTokens)",
        ),
        (503, {"code": "Unavailable", "message": "Unavailable"}, "error: Unavailable"),
    ],
)
def test_a_refusal_is_one_line_with_its_code(
    monkeypatch: pytest.MonkeyPatch, status: int, body: dict[str, Any], line: str
) -> None:
    client = _refusing(status, body)
    monkeypatch.setattr(cli_root, "client", lambda project=None: client)
    result = CliRunner().invoke(cli.app, ["get", "agent/x"])
    assert result.exit_code == 1
    assert result.stderr == line + "\n"
    assert "Traceback" not in result.output


def test_the_clis_own_failures_carry_a_code_too(tmp_path: Path) -> None:
    usage = CliRunner().invoke(cli.app, ["get", "nosuchkind"])
    assert usage.exit_code == 2 and usage.stderr.startswith("error: UsageError: unknown kind 'nosuchkind'")
    missing = CliRunner().invoke(cli.app, ["apply", "-f", str(tmp_path / "missing.yaml")])
    assert missing.exit_code == 1 and missing.stderr.startswith("error: Invalid: cannot read ")
    assert missing.stderr.count("\n") == 1
