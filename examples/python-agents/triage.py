"""A triage agent on the official Anthropic SDK: a durable Python program.

    python examples/python-agents/triage.py

against a running `nodus up` (`make demo` leaves one running). `deploy()` uploads this file as
the Agent's source; the run imports it in its sandbox and calls `main`. Inside the sandbox
`anthropic.Anthropic()` talks to the run's own Messages endpoint (``ANTHROPIC_BASE_URL`` and a
placeholder key, set by the runtime): the call is a journaled, priced model step, answered by
the offline model on a server without a key. ``fetch_issue`` reads a fixture instead of the
network, so the example needs no allowed hosts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic

import nodus

agent = nodus.Agent("py-triage", models=["haiku", "sonnet"], per_run_max_cost="0.50")

# What api.github.com would answer; a real agent fetches it (network=nodus.Egress(allowed_hosts=[...])).
ISSUES: dict[int, dict[str, Any]] = {
    42: {
        "number": 42,
        "title": "Uploading a 2 GiB file times out after 30 seconds",
        "body": "The upload stops at 30 s with a 504 from the gateway; smaller files are fine.",
        "labels": [],
    },
}


@agent.step(effect="idempotent")
def fetch_issue(number: int) -> dict[str, Any]:
    """Runs once; when the run replays (a new actor after a crash, a wake) it returns its result."""
    return dict(ISSUES[number])


@agent.entrypoint
def main(ctx: nodus.RunContext, input: dict[str, Any]) -> dict[str, Any]:
    issue = fetch_issue(input["issue"])
    reply = anthropic.Anthropic().messages.create(
        model="claude-haiku-4-5",
        max_tokens=512,
        messages=[{"role": "user", "content": f"Triage this issue: {issue['title']}"}],
    )
    label = next(block.text for block in reply.content if block.type == "text")
    report = Path("report.md")  # relative paths are in the run's workspace
    report.write_text(
        f"# Issue {issue['number']}: {issue['title']}\n\n{issue['body']}\n\n## Triage\n\n{label}\n"
    )
    ctx.save_output("report", "report.md")
    print(f"triaged issue {issue['number']}")  # the program log: `nodus agentrun logs NAME`
    return {"issue": issue["number"], "label": label, "model": reply.model}


if __name__ == "__main__":  # on your machine; in the sandbox this module is only imported
    agent.deploy()
    run = agent.submit({"issue": 42})
    print(run.result())
    for step in run.steps():
        print(f"{step.id:<22} {step.kind:<8} {step.state:<10} {step.summary}")
    print(run.outputs["report"].read_text())
