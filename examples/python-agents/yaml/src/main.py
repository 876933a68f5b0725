"""The YAML example's program: a plain ``main(ctx, input)``, with steps through ``ctx.step``.

No decorators are needed when the Agent is defined in YAML: ``spec.entrypoint: main:main``
names this function, and every ``ctx.step`` is journaled like an ``@agent.step``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shout import shout


def main(ctx: Any, input: Any) -> dict[str, Any]:
    words = input["words"] if isinstance(input, dict) else str(input).split()
    loud = [ctx.step("shout", lambda w=w: shout(w)) for w in words]
    Path("words.txt").write_text("\n".join(loud) + "\n")
    ctx.save_output("words", "words.txt")
    return {"words": loud, "count": len(loud)}
