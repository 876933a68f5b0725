"""An approval flow: the run parks until a person answers, with no process while it waits.

    python examples/python-agents/approval.py

against a running `nodus up`. The run asks for approval and parks (`Waiting`,
`AwaitingMessage`): no actor, no sandbox process. The message starts a new actor that replays
the program up to the wait and goes on; the change is then applied by an ``external`` step,
whose effect is never repeated (interrupted half-way, the run parks `NeedsResolution` and
`run.resolve(...)` decides).
"""

from __future__ import annotations

import time
from typing import Any

import nodus

agent = nodus.Agent("py-approval", per_run_max_cost="0.10")


@agent.step(effect="external")
def apply_change(change: str, key: str) -> dict[str, Any]:
    """The effect on the outside world; ``key`` (ctx.idempotency_key) lets that API drop a repeat."""
    return {"applied": change, "ticket": f"CHG-{key[-6:]}"}


@agent.entrypoint
def main(ctx: nodus.RunContext, input: dict[str, Any]) -> dict[str, Any]:
    print(f"asking for approval of: {input['change']}")
    approved = ctx.wait_for_message("approval", timeout="1h")  # None once the hour has passed
    if approved is None:
        return {"change": input["change"], "approved": False, "why": "no answer within the hour"}
    if not approved:
        return {"change": input["change"], "approved": False, "why": "refused"}
    return {"change": input["change"], "approved": True, **apply_change(input["change"], ctx.idempotency_key)}


def _reason(run: nodus.AgentRun) -> str | None:
    status: dict[str, Any] = agent.client.get("agentruns", run.name)["status"]
    return status.get("reason")


if __name__ == "__main__":
    agent.deploy()
    run = agent.submit({"change": "raise the upload gateway's timeout to 300 s"})
    deadline = time.monotonic() + 120
    while _reason(run) != "AwaitingMessage" and time.monotonic() < deadline:
        time.sleep(0.5)
    print(f"{run.name}: Waiting, {_reason(run)} (no process while it waits)")
    run.send("approval", True)
    print(run.result())
    # The same program in this process, with an in-memory journal: no server, no Ray, the
    # messages given up front.
    print(agent.local({"change": "a dry run"}, messages={"approval": [True]}))
