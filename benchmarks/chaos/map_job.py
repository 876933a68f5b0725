"""`agent.map` from the SDK, as a user's script calls it (run by the campaign as a subprocess,
configured the documented way: NODUS_API_URL, NODUS_TOKEN, NODUS_PROJECT). Prints the answers
as one JSON list; any failure is a non-zero exit."""

from __future__ import annotations

import json
import sys

import nodus

__all__: list[str] = []


def main() -> None:
    name, inputs = sys.argv[1], json.loads(sys.argv[2])
    agent = nodus.ClaudeAgent(name, system="Answer in one sentence.", families=["haiku"])
    with agent.map(inputs, max_active=2) as answers:
        print(json.dumps(list(answers)))


if __name__ == "__main__":
    main()
