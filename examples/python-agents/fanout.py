"""A fan-out: one run splits its work into child runs and waits for them durably.

    python examples/python-agents/fanout.py

against a running `nodus up`. ``ctx.map`` starts one child run per input (the same Agent and
revision, named ``<run>-map1-0`` ...) and returns their results in order; ``ctx.spawn`` with a
key of your own and ``ctx.gather`` are the same in two moves. While the parent waits for its
children it parks (`AwaitingChildren`) with no process; the last child's end wakes it. A
child's spend counts against its parent's cap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nodus

agent = nodus.Agent("py-fanout", per_run_max_cost="0.30")


@agent.step
def count_words(part: int) -> dict[str, int]:
    """A pure step: the work of one part (here, counting the words of a made-up text)."""
    text = " ".join(f"word{i}" for i in range(10 * (part + 1)))
    return {"part": part, "words": len(text.split())}


@agent.entrypoint
def main(ctx: nodus.RunContext, input: dict[str, Any]) -> Any:
    if "part" in input:  # a child run: the same program, with the child's input
        counted = count_words(input["part"])
        Path("part.txt").write_text(f"part {input['part']}: {counted['words']} words\n")
        ctx.save_output("part", "part.txt")
        return counted
    parts = ctx.map([{"part": p} for p in range(input["parts"])])
    children = [ctx.spawn({"part": p}, key=f"check-{p}") for p in range(input["parts"])]
    checks = ctx.gather(children, return_exceptions=True)
    first = ctx.child_output(children[0], "part")
    return {
        "parts": parts,
        "checked": checks == parts,
        "total": sum(p["words"] for p in parts),
        "first": first,
    }


if __name__ == "__main__":
    agent.deploy()
    run = agent.submit({"parts": 3})
    print(run.result())
    for child in run.children():
        print(f"{child.name:<40} {json.dumps(json.loads(child.result()))}")  # the answer is its JSON
