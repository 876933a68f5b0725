"""The project Budget on the real server: it stops a project's spending at its limit, model and
sandbox, and raising it lets the waiting runs finish.

Each test uses a project of its own, so its Budget holds back no other test's runs. The model is
the offline one (priced, Nodus access) for the model spend; for the sandbox spend the agent is
BYOK on the fake Anthropic API, so its model calls bill nothing and everything the Budget counts
is the commands' sandbox compute.
"""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import nodus
from tests.fakes.anthropic_api import text_reply, tool_use_reply

from .conftest import Server, unique, wait_for

V1 = "nodus.dev/v1"


def _agent(server: Server, project: str, name: str, **spec: Any) -> None:
    with server.http() as http:
        response = http.put(
            f"/v1/projects/{project}/agents/{name}",
            json={"apiVersion": V1, "kind": "Agent", "metadata": {"name": name}, "spec": spec},
        )
        assert response.status_code in (200, 201), response.text


def _run(server: Server, project: str, agent: str, prompt: str) -> str:
    name = unique("run")
    with server.http() as http:
        response = http.post(
            f"/v1/projects/{project}/agentruns",
            json={
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": name},
                "spec": {"agent": agent, "input": prompt},
            },
        )
        assert response.status_code == 201, response.text
    return name


def _get_run(server: Server, project: str, name: str) -> dict[str, Any]:
    with server.http() as http:
        run: dict[str, Any] = http.get(f"/v1/projects/{project}/agentruns/{name}").json()
    return run


def _budget(server: Server, project: str) -> dict[str, Any]:
    with server.http() as http:
        response = http.get(f"/v1/projects/{project}/budgets/default")
        assert response.status_code == 200, response.text
        budget: dict[str, Any] = response.json()
    return budget


def _waiting_for_budget(server: Server, project: str, name: str) -> dict[str, Any]:
    def parked() -> dict[str, Any] | None:
        run = _get_run(server, project, name)
        status = run["status"]
        return run if (status["phase"], status.get("reason")) == ("Waiting", "BudgetExceeded") else None

    found: dict[str, Any] = wait_for(parked, timeout=90, message=f"run {name} to wait with BudgetExceeded")
    return found


def _succeeded(server: Server, project: str, name: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        run = _get_run(server, project, name)
        return run if run["status"]["phase"] in ("Succeeded", "Failed", "Cancelled") else None

    run: dict[str, Any] = wait_for(ended, timeout=120, message=f"run {name} to end")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    return run


def _billed(run: dict[str, Any]) -> Decimal:
    cost = run["status"]["cost"]
    return Decimal(cost.get("billedUSD") or "0")


def _spent_within(server: Server, project: str) -> dict[str, Any]:
    """The Budget now, checked: spent + reserved never above maxCostUSD, spent what the runs billed."""
    budget = _budget(server, project)
    status, limit = budget["status"], Decimal(budget["spec"]["maxCostUSD"])
    assert Decimal(status["spentUSD"]) + Decimal(status["reservedUSD"]) <= limit, budget
    assert Decimal(status["leftUSD"]) == limit - Decimal(status["spentUSD"]) - Decimal(status["reservedUSD"])
    return budget


def test_a_budget_stops_model_spend_at_its_limit_and_raising_it_lets_the_runs_finish(
    server: Server, sdk_env: Server, tmp_path: Path
) -> None:
    project = unique("budget")
    _agent(
        server,
        project,
        "helper",
        maxTokens=256,
        perRunMaxCostUSD="0.50",
        model={"access": "Nodus", "families": ["haiku"]},
    )
    manifest = tmp_path / "budget.yaml"
    manifest.write_text(
        f"apiVersion: {V1}\nkind: Budget\nmetadata:\n  name: default\nspec:\n"
        '  maxCostUSD: "0.000001"\n  period: total\n'
    )
    applied = server.cli("apply", "-f", str(manifest), "-p", project)
    assert applied.returncode == 0 and "budget/default created" in applied.stdout, applied.stderr

    # Nothing fits: every run waits before its first call, having spent nothing.
    names = [_run(server, project, "helper", f"What is {i} * 7?") for i in (2, 3, 6)]
    for name in names:
        run = _waiting_for_budget(server, project, name)
        assert _billed(run) == 0 and run["status"]["actorName"] is None
    assert _spent_within(server, project)["status"]["spentUSD"] == "0"

    # Bad input is refused naming the field, and nothing changes.
    for patch, field in (
        ({"spec": {"period": "week"}}, "spec.period"),
        ({"spec": {"maxCostUSD": "-1"}}, "spec.maxCostUSD"),
        ({"spec": {"maxCostUSD": "ten"}}, "spec.maxCostUSD"),
    ):
        refused = server.cli("patch", "budget", "default", "--patch", json.dumps(patch), "-p", project)
        assert refused.returncode != 0 and field in refused.stderr, refused.stderr
    assert _budget(server, project)["spec"] == {"maxCostUSD": "0.000001", "period": "total"}

    # Raised, the Budget lets the waiting runs go on: each finishes, and the Budget counts them.
    raised = server.cli(
        "patch", "budget", "default", "--patch", '{"spec":{"maxCostUSD":"1.00"}}', "-p", project
    )
    assert raised.returncode == 0 and "budget/default patched" in raised.stdout, raised.stderr
    finished = [_succeeded(server, project, name) for name in names]
    assert finished[2]["status"]["answer"]["preview"].strip() == "6 * 7 = 42."
    spent = sum((_billed(run) for run in finished), Decimal(0))
    assert spent > 0
    budget = _spent_within(server, project)
    assert Decimal(budget["status"]["spentUSD"]) == spent

    # A Budget below what is spent is refused with the figure.
    below = server.cli(
        "patch", "budget", "default", "--patch", '{"spec":{"maxCostUSD":"0.000001"}}', "-p", project
    )
    shown_spent = budget["status"]["spentUSD"]  # the figure as the server writes it
    assert below.returncode != 0 and f"spent ${shown_spent}" in below.stderr, below.stderr
    assert _budget(server, project)["spec"]["maxCostUSD"] == "1.00"

    # At its limit (a hair above what is spent) the next run waits, and spends nothing.
    limit = spent + Decimal("0.000001")
    tight = server.cli(
        "patch",
        "budget",
        "default",
        "--patch",
        json.dumps({"spec": {"maxCostUSD": str(limit)}}),
        "-p",
        project,
    )
    assert tight.returncode == 0, tight.stderr
    late = _run(server, project, "helper", "What is 6 * 7?")
    assert _billed(_waiting_for_budget(server, project, late)) == 0
    shown = server.cli("get", "budget", "-p", project)
    assert shown.returncode == 0 and f"${shown_spent}" in shown.stdout and "$0.000001" in shown.stdout, (
        shown.stdout
    )
    described = server.cli("describe", "budget", "default", "-p", project)
    assert described.returncode == 0 and "Left:      $0.000001" in described.stdout, described.stdout
    assert Decimal(_spent_within(server, project)["status"]["spentUSD"]) == spent

    # The SDK shows the same figures and raises it: the last run finishes too.
    budget_handle = nodus.Budget.get(project=project)
    assert (budget_handle.spent, budget_handle.left, budget_handle.period) == (
        spent,
        Decimal("0.000001"),
        "total",
    )
    budget_handle.update(max_cost_usd="2")
    last = _succeeded(server, project, late)
    budget = _spent_within(server, project)
    assert Decimal(budget["status"]["spentUSD"]) == spent + _billed(last)


def test_a_budget_stops_sandbox_spend_too(server: Server, fake_anthropic: Any) -> None:
    """A BYOK run bills nothing for its model calls, so what it spends is its commands' sandbox
    compute: each command is held against the Budget before it runs."""
    project = unique("budget-sbx")
    key = f"sk-ant-budget-{uuid.uuid4().hex}"
    secret = unique("anthropic-key")
    created = server.cli(
        "create", "secret", secret, "--from-literal", f"ANTHROPIC_API_KEY={key}", "-p", project
    )
    assert created.returncode == 0, created.stderr
    _agent(
        server,
        project,
        "byok",
        maxTokens=512,
        model={"access": "BYOK", "name": "claude-haiku-5-5", "apiKeySecret": secret},
    )
    with server.http() as http:
        made = http.post(
            f"/v1/projects/{project}/budgets",
            json={
                "apiVersion": V1,
                "kind": "Budget",
                "metadata": {"name": "default"},
                "spec": {"maxCostUSD": "0.000001", "period": "day"},
            },
        )
        assert made.status_code == 201, made.text
        assert made.json()["status"]["periodEnd"], made.json()
    fake_anthropic.script(
        tool_use_reply("echo hi", usage={"input_tokens": 100, "output_tokens": 20}),
        text_reply("It printed hi.", usage={"input_tokens": 140, "output_tokens": 10}),
    )
    name = _run(server, project, "byok", "use the shell to print hi")
    parked = _waiting_for_budget(server, project, name)
    # The command's largest price did not fit: it never ran, and nothing was billed.
    assert Decimal(parked["status"]["cost"].get("sandboxUSD") or "0") == 0
    with server.http() as http:
        steps = http.get(f"/v1/projects/{project}/agentruns/{name}/steps").json()["items"]
    assert not [step for step in steps if step["kind"] == "command" and step["state"] == "Completed"]
    assert _spent_within(server, project)["status"]["spentUSD"] == "0"

    with server.http() as http:
        raised = http.patch(
            f"/v1/projects/{project}/budgets/default",
            json={"spec": {"maxCostUSD": "1"}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert raised.status_code == 200, raised.text
    run = _succeeded(server, project, name)
    cost = run["status"]["cost"]
    assert Decimal(cost["totalUSD"]) == 0 and Decimal(cost["sandboxUSD"]) > 0, cost
    assert Decimal(cost["billedUSD"]) == Decimal(cost["sandboxUSD"])
    budget = _spent_within(server, project)
    assert Decimal(budget["status"]["spentUSD"]) == Decimal(cost["billedUSD"])
