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

from nodus.resources import FAMILIES

__all__ = ["RouteDecision", "route", "fallback_family"]

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
