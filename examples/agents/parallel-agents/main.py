"""Run questions in parallel under one AgentGroup, then fan a list out with agent.map.

Run it with `python examples/agents/parallel-agents/main.py`.
"""

import nodus


def main() -> None:
    agent = nodus.ClaudeAgent(
        "parallel-agents-py",
        system="You answer every question in one short sentence.",
        families=["haiku"],
        max_tokens=1024,
        per_run_max_cost="0.10",
    )
    agent.deploy()

    group = nodus.AgentGroup.create("parallel-agents-py", agent, max_active=2, max_cost="0.60")
    try:
        group.submit_many(
            [
                {"key": "a", "input": "What is the capital of France?"},
                {"key": "b", "input": "What is the capital of Japan?"},
                # c starts only after a and b have succeeded.
                {"key": "c", "input": "Say that both questions are answered.", "depends_on": ["a", "b"]},
            ]
        )
        group.seal()
        status = group.wait()
        print(f"{status.phase}: {status.counts.succeeded} of {status.counts.total} runs succeeded")
        for run in group.runs():
            print(run.name, "->", run.answer())
    finally:
        group.delete()

    # For a plain list of inputs, map does the same in one call and returns the answers in order.
    for answer in agent.map(["What is 2 + 2?", "What is 3 + 3?"], max_active=2):
        print(answer)


if __name__ == "__main__":
    main()
