"""A long-lived chat: one run answers message after message, its history kept bounded.

    python examples/python-agents/chat.py

against a running `nodus up`. The run waits for each ``user`` message with no process, answers
it through the Anthropic SDK (a journaled model step) and, every ``EVERY`` messages, calls
``ctx.continue_as_new`` with a summary of the conversation: the run goes on under the same
name with a fresh journal generation, so a chat that lasts for months replays at most
``EVERY`` messages after a crash, not all of them.
"""

from __future__ import annotations

from typing import Any

import anthropic

import nodus

agent = nodus.Agent("py-chat", models=["haiku"], per_run_max_cost="0.50")

EVERY = 3  # messages per journal generation
KEEP = 4  # exchanges carried into the next generation


@agent.entrypoint
def main(ctx: nodus.RunContext, input: Any) -> dict[str, Any]:
    state = input if isinstance(input, dict) else {"generation": 1, "answered": 0, "recent": []}
    client = anthropic.Anthropic()
    for _ in range(EVERY):
        text = ctx.wait_for_message("user", timeout="1h")
        if text is None or text == "/bye":
            return {
                "generations": state["generation"],
                "answered": state["answered"],
                "recent": state["recent"],
            }
        reply = client.messages.create(
            model="claude-haiku-4-5", max_tokens=256, messages=[{"role": "user", "content": text}]
        )
        answer = next(block.text for block in reply.content if block.type == "text")
        print(f"user: {text}\nassistant: {answer}")
        state["answered"] += 1
        state["recent"] = [*state["recent"], [text, answer]][-KEEP:]
    ctx.continue_as_new({**state, "generation": state["generation"] + 1})  # does not return


if __name__ == "__main__":
    agent.deploy()
    run = agent.submit()
    questions = ["What is 2 + 2?", "What is 3 x 4?", "What is 10 / 4?", "What is 2 ** 10?", "What is 7 - 9?"]
    for question in questions:
        run.send("user", question)
    run.send("user", "/bye")
    print(run.result())  # 2 generations, 5 answered, the last 4 exchanges
    for step in run.steps():  # the last generation's journal only
        print(f"{step.id:<22} {step.kind:<8} {step.state:<10} {step.summary}")
