"""The Python side of the hello example: define an agent, run it, read what it did.

Run it with `python examples/hello/main.py` against a running `nodus up`.
"""

import nodus

agent = nodus.ClaudeAgent("helper", system="You are careful.", families=["haiku", "sonnet"])
print(agent.remote("Use the shell to print the Python version"))

run = agent.submit("Use the shell to count the files in the workspace")
run.wait()
print(run.answer())
for step in run.steps():
    print(f"{step.id:<22} {step.kind:<8} {step.state:<10} {step.summary}")
