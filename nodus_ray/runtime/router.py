"""Pick the model family that serves a whole turn.

The router ("jev") scores a prompt's features and chooses among the families the agent
allows: short, simple requests go to haiku, demanding ones climb towards fable. It runs once
per turn, before the first model call, and its decision holds for the whole turn so the model
never changes mid-turn. When it cannot decide, sonnet answers, or the allowed family nearest
to sonnet, and the turn says ``fallback``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodus.contract import FAMILIES
from nodus_ray.money.prices import ROUTER_MAX_OUTPUT_TOKENS

__all__ = [
    "RouteDecision",
    "route",
    "fallback_family",
    "router_input_tokens",
    "ROUTER_MAX_OUTPUT_TOKENS",
    "JevRouter",
    "ROUTER_ACTOR_NAME",
]

ROUTER_ACTOR_NAME = "nodus-router"
_ROUTER_FRAMING_TOKENS = 64

_ORDER = {family: index for index, family in enumerate(FAMILIES)}  # haiku < sonnet < opus < fable
_DEMANDING = re.compile(
    r"\b(prove|design|architect|refactor|optimi[sz]e|analy[sz]e|debug|plan|research|compare|"
    r"trade-?offs?|explain why|step by step|algorithm|concurren\w*|distributed)\b",
    re.IGNORECASE,
)
_CODE = re.compile(r"```|\bdef |\bclass |\bfunction\b|\bstack trace\b|Traceback", re.IGNORECASE)


@dataclass(frozen=True)
class RouteDecision:
    family: str
    routing: str  # "jev" when the router chose, "fallback" when it could not
    score: int


def fallback_family(allowed: list[str]) -> str:
    """Sonnet, or the allowed family nearest to it (the cheaper one on a tie)."""
    target = _ORDER["sonnet"]
    return min(allowed, key=lambda family: (abs(_ORDER[family] - target), _ORDER[family]))


def _score(prompt: str) -> int:
    """0 (simple) to 3 (demanding), from length, demanding verbs and code."""
    score = 0
    words = len(prompt.split())
    if words > 60:
        score += 1
    if words > 400:
        score += 1
    score += min(2, len(_DEMANDING.findall(prompt)))
    if _CODE.search(prompt):
        score += 1
    return min(score, 3)


def route(prompt: str, allowed: list[str] | None) -> RouteDecision:
    """The family for this prompt among ``allowed`` (all families when None)."""
    families = [family for family in FAMILIES if family in (allowed or FAMILIES)]
    if not families:
        return RouteDecision(family="sonnet", routing="fallback", score=-1)
    try:
        score = _score(prompt)
    except Exception:  # a router that cannot read the prompt must not stop the turn
        return RouteDecision(family=fallback_family(families), routing="fallback", score=-1)
    wanted = FAMILIES[score]
    # The cheapest allowed family at least as strong as wanted, else the strongest allowed.
    stronger = [family for family in families if _ORDER[family] >= _ORDER[wanted]]
    family = stronger[0] if stronger else families[-1]
    return RouteDecision(family=family, routing="jev", score=score)


def router_input_tokens(prompt: str) -> int:
    """An upper bound of the router call's input tokens: every token covers at least one byte."""
    return len(prompt.encode("utf-8")) + _ROUTER_FRAMING_TOKENS


class JevRouter:
    """The router service: one named actor the runs ask before each turn.

    It is a service rather than a function so that it can be unavailable, upgraded or moved
    without touching runs; a run that cannot reach it falls back to sonnet.
    """

    def __repr__(self) -> str:
        return "JevRouter(families=haiku|sonnet|opus|fable)"

    async def route(self, prompt: str, allowed: list[str]) -> dict[str, object]:
        decision = route(prompt, allowed)
        if decision.routing != "jev":
            raise RuntimeError("the router could not score this prompt")
        # Billed on the prompt's tokens (estimated at 4 characters each, within the bound).
        tokens = min(router_input_tokens(prompt), -(-len(prompt) // 4) + _ROUTER_FRAMING_TOKENS)
        return {"family": decision.family, "score": decision.score, "inputTokens": tokens}
