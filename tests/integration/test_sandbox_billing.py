"""Sandbox billing end to end (decision 44): a run whose command burns CPU is billed for it.

On the real server, the offline model runs the command given after "run:" verbatim: a shell
loop of 300,000 steps. The run's ``status.cost`` must keep ``totalUSD`` the model spend (what the
cap counts and the project's credits pay: the steps' costs), show the sandbox compute apart
(``sandboxUSD``: what the command step journaled, CPU-seconds at the list price and the
workspace's GiB-hours) and ``billedUSD`` as both. The figures survive the control plane
recomputing them from the journal: a keep-alive run answered, then cancelled, is settled from
its journal (`RunSupervisor.settle_cost`) to exactly what it reported, charged once.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from .conftest import Server, unique, wait_for

V1 = "nodus.dev/v1"
# A fixed amount of work (about 0.2 CPU-seconds here), not a length of time: a loaded machine
# stretches its wall time, not the CPU it needs.
BURN = "run: i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo burned"


def _agent(http: Any, base: str, name: str) -> None:
    made = http.put(
        f"{base}/agents/{name}",
        json={
            "apiVersion": V1,
            "kind": "Agent",
            "metadata": {"name": name},
            "spec": {
                "system": "Use the shell when asked.",
                "maxTokens": 512,
                "model": {"access": "Nodus", "families": ["haiku"]},  # one family: no routing call
            },
        },
    )
    assert made.status_code in (200, 201), made.text


def _run(http: Any, base: str, name: str, agent: str, **spec: Any) -> None:
    created = http.post(
        f"{base}/agentruns",
        json={
            "apiVersion": V1,
            "kind": "AgentRun",
            "metadata": {"name": name},
            "spec": {"agent": agent, "input": BURN, **spec},
        },
    )
    assert created.status_code == 201, created.text


def _when(server: Server, base: str, name: str, *phases: tuple[str, str | None]) -> dict[str, Any]:
    def wanted(status: dict[str, Any]) -> bool:
        return any(status["phase"] == p and (r is None or status.get("reason") == r) for p, r in phases)

    def reached() -> dict[str, Any] | None:
        with server.http() as http:
            run: dict[str, Any] = http.get(f"{base}/agentruns/{name}").json()
        status = run["status"]
        if wanted(status):
            return run
        if status["phase"] in ("Failed", "Cancelled"):
            raise AssertionError(f"run {name} ended {status['phase']}: {status.get('message')}")
        return None

    found: dict[str, Any] = wait_for(reached, timeout=120, message=f"run {name} to reach {phases}")
    return found


def _journal_says(steps: list[dict[str, Any]]) -> tuple[Decimal, Decimal]:
    """The model spend and the sandbox charges the run's steps recorded."""
    model = sum((Decimal(step["costUSD"]) for step in steps), Decimal(0))
    sandbox = sum(
        (
            Decimal(str((step["detail"].get("result") or {}).get("sandboxUSD") or "0"))
            for step in steps
            if step["kind"] in ("command", "setup", "charge") and step["state"] == "Completed"
        ),
        Decimal(0),
    )
    return model, sandbox


def test_a_command_that_burns_cpu_is_billed_apart_from_the_model_spend(server: Server) -> None:
    project = unique("sbx")  # a project of its own: its credits hold this run alone
    base = f"/v1/projects/{project}"
    name = unique("burn")
    with server.http() as http:
        sandbox_prices = http.get("/v1/prices").json()["sandbox"]
        _agent(http, base, "burner")
        before = http.get(f"{base}/credits").json()
        _run(http, base, name, "burner")
    run = _when(server, base, name, ("Succeeded", None))
    cost = run["status"]["cost"]
    with server.http() as http:
        steps = http.get(f"{base}/agentruns/{name}/steps").json()["items"]
        after = http.get(f"{base}/credits").json()

    command = next(step for step in steps if step["kind"] == "command")
    recorded = command["detail"]["result"]
    assert "burned" in recorded["output"]
    # The loop's CPU, measured outside the sandbox.
    assert recorded["cpuSeconds"] > 0.05
    cpu_price = Decimal(sandbox_prices["cpuSecondUSD"])
    assert Decimal(recorded["sandboxUSD"]) >= (Decimal(str(recorded["cpuSeconds"])) * cpu_price).quantize(
        Decimal("0.000001")
    )
    assert Decimal(recorded["sandboxUSD"]) <= Decimal(recorded["sandboxReservedUSD"])

    model_spend, sandbox_spend = _journal_says(steps)
    assert Decimal(cost["sandboxUSD"]) == sandbox_spend > 0
    # totalUSD keeps its meaning: the model spend, which the credits paid and the cap counts.
    assert Decimal(cost["totalUSD"]) == Decimal(cost["modelUSD"]) == model_spend > 0
    assert Decimal(cost["billedUSD"]) == model_spend + sandbox_spend
    assert Decimal(after["spentUSD"]) - Decimal(before["spentUSD"]) == model_spend


def test_the_journal_settles_a_stopped_run_to_the_figures_it_reported(server: Server) -> None:
    project = unique("sbx")
    base = f"/v1/projects/{project}"
    name = unique("kept")
    with server.http() as http:
        _agent(http, base, "burner")
        _run(http, base, name, "burner", keepAlive=True)
    answered = _when(server, base, name, ("Waiting", "AwaitingMessage"))
    reported = answered["status"]["cost"]
    assert Decimal(reported["sandboxUSD"]) > 0

    with server.http() as http:
        cancelled = http.post(f"{base}/agentruns/{name}/cancel")
        assert cancelled.status_code == 200, cancelled.text
    # Once stopped, the control plane recomputes the cost from the journal (`settle_cost`):
    # the same figures, every charge counted once.
    run = _when(server, base, name, ("Cancelled", None))
    with server.http() as http:
        steps = http.get(f"{base}/agentruns/{name}/steps").json()["items"]
    settled = run["status"]["cost"]
    model_spend, sandbox_spend = _journal_says(steps)
    for field in ("totalUSD", "modelUSD", "sandboxUSD", "billedUSD"):
        assert Decimal(settled[field]) == Decimal(reported[field]), field
    assert Decimal(settled["sandboxUSD"]) == sandbox_spend
    assert Decimal(settled["totalUSD"]) == model_spend
    assert Decimal(settled["billedUSD"]) == model_spend + sandbox_spend
