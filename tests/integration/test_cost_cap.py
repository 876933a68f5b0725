"""The per-run cap end to end: a run on the real server stops at its cap after a call it could afford.

The documents ("What a run costs"): before each call the run checks that the call, at its largest
(the whole conversation as input and ``maxTokens`` of output), still fits under
``perRunMaxCostUSD``; when it does not, the run waits with ``MaxCostReached`` and makes no more
calls. Each call is billed from the project's credits at cost / 0.875.

The run here is on the offline model (opus, priced at a tenth of Claude's opus), one family so
there is no routing call, ``maxTokens`` 1024 and a $0.03 cap. Its first call's worst case is about
$0.013 (a bound of some 1,900 tokens of conversation at the $1.875 cache-write rate, 1,024 output
tokens at $7.50, over the margin), so it is made. The command it asks for prints 30,000 bytes,
which the next call would send back: at its largest that call may cost about $0.079, more than the
cap leaves, so it is never made. The run must then wait with ``MaxCostReached``, have spent no more
than the cap, exactly the price of the one call's usage, and the project's credit ledger must be
charged exactly what the run's journal recorded, with nothing left reserved.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal
from typing import Any

from .conftest import Server, unique, wait_for

V1 = "nodus.dev/v1"
MICRO = Decimal("0.000001")
CAP = Decimal("0.03")
# The offline model runs a command given after "run:" verbatim: 30,000 bytes of output.
PROMPT = "run: head -c 30000 /dev/zero | tr '\\0' a"


def _ceil(amount: Decimal) -> Decimal:
    return amount.quantize(MICRO, rounding=ROUND_CEILING)


def _billed(price: dict[str, str], usage: dict[str, int]) -> Decimal:
    """The documents' price of a call's usage: per-million rates, rounded up, then / 0.875 rounded up."""
    raw = (
        usage["input_tokens"] * Decimal(price["input"])
        + usage["output_tokens"] * Decimal(price["output"])
        + usage["cache_creation_input_tokens"] * Decimal(price["cacheWrite"])
        + usage["cache_read_input_tokens"] * Decimal(price["cacheRead"])
    ) / 10**6
    return _ceil(_ceil(raw) / Decimal("0.875"))


def _settled(server: Server, project: str, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        with server.http() as http:
            run: dict[str, Any] = http.get(f"/v1/projects/{project}/agentruns/{name}").json()
        phase = run["status"]["phase"]
        return run if phase in ("Succeeded", "Failed", "Cancelled", "Waiting") else None

    settled: dict[str, Any] = wait_for(done, timeout=120, message=f"run {name} to settle")
    return settled


def test_a_run_stops_at_its_cap_after_a_call_and_the_ledger_is_charged_what_it_spent(
    server: Server,
) -> None:
    project = unique("cap")  # a project of its own: its ledger holds this run alone
    base = f"/v1/projects/{project}"
    name = unique("capped")
    with server.http() as http:
        agent = http.put(
            f"{base}/agents/capped",
            json={
                "apiVersion": V1,
                "kind": "Agent",
                "metadata": {"name": "capped"},
                "spec": {
                    "system": "Use the shell when asked.",
                    "perRunMaxCostUSD": str(CAP),
                    "maxTokens": 1024,
                    "model": {"access": "Nodus", "families": ["opus"]},
                },
            },
        )
        assert agent.status_code in (200, 201), agent.text
        before = http.get(f"{base}/credits").json()
        created = http.post(
            f"{base}/agentruns",
            json={
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": name},
                "spec": {"agent": "capped", "input": PROMPT},
            },
        )
        assert created.status_code == 201, created.text

    run = _settled(server, project, name)
    status = run["status"]
    assert (status["phase"], status["reason"]) == ("Waiting", "MaxCostReached"), status
    assert "perRunMaxCostUSD" in status["message"]

    with server.http() as http:
        steps = http.get(f"{base}/agentruns/{name}/steps").json()["items"]
        prices = http.get("/v1/prices").json()["prices"]
        after = http.get(f"{base}/credits").json()

    # One call was made and its command ran; the next call was refused before it was made.
    assert [(step["kind"], step["state"]) for step in steps] == [
        ("sandbox", "Completed"),
        ("route", "Completed"),
        ("model", "Completed"),
        ("command", "Completed"),
    ], steps
    model = next(step for step in steps if step["kind"] == "model")
    result = model["detail"]["result"]
    assert result["model"] == "offline-opus" and result["stop_reason"] == "tool_use"

    # What the run recorded: the price of the one call's usage, and no more than the cap.
    spent = Decimal(status["cost"]["totalUSD"])
    assert sum(Decimal(step["costUSD"]) for step in steps) == spent
    assert Decimal(model["costUSD"]) == spent == _billed(prices["offline-opus"], result["usage"])
    assert Decimal(0) < spent <= CAP
    assert Decimal(status["cost"]["limitUSD"]) == CAP
    # The refusal was for a call that really did not fit: "may cost up to $X but only $Y ... is left".
    needed = Decimal(status["message"].split("up to $", 1)[1].split()[0])
    assert needed > CAP - spent

    # The project's ledger: charged exactly the run's recorded cost, nothing left reserved.
    assert Decimal(before["spentUSD"]) == 0 and Decimal(before["reservedUSD"]) == 0
    assert Decimal(after["spentUSD"]) == spent
    assert Decimal(after["balanceUSD"]) == Decimal(before["balanceUSD"]) - spent
    assert Decimal(after["grantedUSD"]) == Decimal(before["grantedUSD"])
    assert Decimal(after["reservedUSD"]) == 0
