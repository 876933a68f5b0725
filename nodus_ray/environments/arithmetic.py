"""``nodus/arithmetic-v2@2.0.0``: arithmetic questions graded on the answer's final number.

Two kinds of task, drawn per task by the seeded RNG:

* plain expressions (~70%), "What is 37 * 12?" or "Compute (8 + 5) * 3.", which the built-in
  offline model answers correctly, so an offline evaluation has passes to show;
* word problems (~30%) the offline model can only restate.

The expected result never appears in the prompt, not even inside a longer number: a reply
that merely repeats the prompt (the offline model restates, and cuts long prompts at 120
characters, possibly mid-number) can then never pass by accident.

The grader reads the *last* number of the answer, because models put the result at the end
("37 * 12 = 444."). It accepts a sign, thousands separators and a decimal form of an integer
(444.0). Evidence names the number it read, never the expected one.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import ClassVar

from nodus_ray.environments.base import Environment, Grade, Task
from nodus_ray.environments.workspace import GradingWorkspace

__all__ = ["ArithmeticV2", "last_number"]

_PLAIN_SHARE = 0.7
_MAX_ATTEMPTS = 200
_SHOWN_DIGITS = 40  # how much of the agent's number the evidence quotes
# A number not glued to a word or another number: "-14", "1,234", "444.0", never the "2" of "v2"
# or of "3.11.2". A minus counts only where it cannot be a subtraction ("= -14", not "3-17").
_NUMBER_RE = re.compile(
    r"(?<![\w.])(?P<sign>[-\u2212](?=[0-9]))?(?<![\w.])"
    r"(?P<int>[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?P<frac>\.[0-9]+)?(?![\w])"
)


def last_number(text: str) -> tuple[Decimal, str] | None:
    """The last number in ``text`` and how it was written, or None when there is none."""
    matches = list(_NUMBER_RE.finditer(text))
    for match in reversed(matches):
        try:
            return _to_decimal(match), match.group(0)
        except InvalidOperation:
            continue
    return None


def _to_decimal(match: re.Match[str]) -> Decimal:
    sign = "-" if match["sign"] else ""
    return Decimal(sign + match["int"].replace(",", "") + (match["frac"] or ""))


# -- plain expressions -------------------------------------------------------------------------


def _operand(rng: random.Random, op: str) -> int:
    """Small operands for products (keeps answers readable), larger ones for sums."""
    return rng.randint(2, 40) if op == "*" else rng.randint(2, 999)


def _plain(rng: random.Random) -> tuple[str, int]:
    shape = rng.choice(("binary", "chain", "left-group", "right-group"))
    ops = [rng.choice("+-*"), rng.choice("+-*")]
    if shape == "binary":
        a, b = _operand(rng, ops[0]), _operand(rng, ops[0])
        expression = f"{a} {ops[0]} {b}"
    elif shape == "chain":
        a, b = _operand(rng, ops[0]), _operand(rng, ops[0])
        c = _operand(rng, ops[1])
        expression = f"{a} {ops[0]} {b} {ops[1]} {c}"
    elif shape == "left-group":
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        c = _operand(rng, ops[1])
        expression = f"({a} {ops[0]} {b}) {ops[1]} {c}"
    else:
        a = _operand(rng, ops[0])
        b, c = rng.randint(2, 60), rng.randint(2, 60)
        expression = f"{a} {ops[0]} ({b} {ops[1]} {c})"
    value = _evaluate(expression)
    if rng.random() < 0.5:
        return f"What is {expression}?", value
    return f"Compute {expression}.", value


def _evaluate(expression: str) -> int:
    """Our own expressions only (digits, + - *, parentheses, spaces): checked before eval."""
    if not re.fullmatch(r"[0-9+\-*() ]+", expression):
        raise ValueError(f"not a generated expression: {expression!r}")
    value = eval(expression, {"__builtins__": {}}, {})  # noqa: S307 - digits and operators only
    assert isinstance(value, int)
    return value


# -- word problems -----------------------------------------------------------------------------
# Each returns (prompt, answer). The wording avoids every cue the offline model acts on: shell
# words (run, command, ...), "files", and operator words (plus, minus, times, x, squared), so it
# restates them instead of computing or running anything.


def _crates(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(3, 24), rng.randint(3, 24), rng.randint(2, 9)
    fruit = rng.choice(("apples", "pears", "lemons", "plums"))
    return (f"A crate holds {a} boxes of {b} {fruit}. How many {fruit} are in {c} crates?", a * b * c)


def _marbles(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(20, 90), rng.randint(2, 19)
    c, d = rng.randint(2, 9), rng.randint(3, 15)
    name = rng.choice(("Mia", "Noah", "Lena", "Omar", "Ines"))
    return (
        f"{name} has {a} marbles, gives {b} of them to a friend, and buys {c} bags of {d} marbles. "
        f"How many marbles does {name} have now?",
        a - b + c * d,
    )


def _garden(rng: random.Random) -> tuple[str, int]:
    a, b, c, d = rng.randint(3, 30), rng.randint(3, 30), rng.randint(2, 20), rng.randint(2, 20)
    return (
        f"A garden has {a} rows of {b} tulips and {c} rows of {d} roses. "
        f"How many flowers grow in the garden?",
        a * b + c * d,
    )


def _tank(rng: random.Random) -> tuple[str, int]:
    b, c = rng.randint(3, 25), rng.randint(2, 12)
    a = b * c + rng.randint(10, 400)
    return (
        f"A tank holds {a} litres of water. It loses {b} litres each day. "
        f"How many litres are left after {c} days?",
        a - b * c,
    )


def _classes(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(15, 35), rng.randint(3, 12)
    c = rng.randint(2, a)
    return (
        f"A school has {b} classes of {a} students each. On Monday {c} students are absent. "
        f"How many students are present on Monday?",
        a * b - c,
    )


def _shop(rng: random.Random) -> tuple[str, int]:
    a, b, c, d = rng.randint(2, 20), rng.randint(2, 12), rng.randint(2, 9), rng.randint(3, 30)
    return (
        f"Pens cost {a} dollars each and notebooks cost {d} dollars each. "
        f"How many dollars do {b} pens and {c} notebooks cost together?",
        a * b + c * d,
    )


def _shelves(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(3, 12), rng.randint(10, 60), rng.randint(5, 90)
    return (
        f"A library has {a} shelves with {b} books on each shelf, and {c} more books on a cart. "
        f"How many books does the library have?",
        a * b + c,
    )


_WORD_PROBLEMS: tuple[Callable[[random.Random], tuple[str, int]], ...] = (
    _crates,
    _marbles,
    _garden,
    _tank,
    _classes,
    _shop,
    _shelves,
)


def _word(rng: random.Random) -> tuple[str, int]:
    return rng.choice(_WORD_PROBLEMS)(rng)


def _answer_hidden(prompt: str, answer: int) -> bool:
    """The answer's digits are not part of any number in the prompt (not even a prefix of one)."""
    digits = str(abs(answer))
    return all(digits not in match["int"].replace(",", "") for match in _NUMBER_RE.finditer(prompt))


class ArithmeticV2(Environment):
    """Arithmetic questions; the answer's final number must equal the exact integer result."""

    owner: ClassVar[str] = "nodus"
    name: ClassVar[str] = "arithmetic-v2"
    version: ClassVar[str] = "2.0.0"
    description: ClassVar[str] = (
        "Arithmetic: plain expressions (+, -, *, parentheses) and short word problems. The answer's "
        "final number must equal the exact integer result."
    )
    splits: ClassVar[tuple[str, ...]] = ("train", "test")

    def tasks(self, split: str, seed: int, count: int) -> list[Task]:
        self.check_request(split, seed, count)
        seen: set[str] = set()
        batch: list[Task] = []
        for index in range(count):
            prompt, answer = self._draw(split, seed, index, seen)
            seen.add(prompt)
            batch.append(Task(id=self.task_id(split, index), prompt=prompt, answer=answer))
        return batch

    def _draw(self, split: str, seed: int, index: int, seen: set[str]) -> tuple[str, int]:
        """Task ``index``: the first candidate that is in this split, new in the batch and hides its answer.

        Depends only on earlier tasks of the same batch, so batches stay prefixes of each other.
        """
        for attempt in range(_MAX_ATTEMPTS):
            rng = self.task_random(split, seed, index, attempt)
            prompt, answer = _plain(rng) if rng.random() < _PLAIN_SHARE else _word(rng)
            if prompt in seen or not self.in_split(split, prompt) or not _answer_hidden(prompt, answer):
                continue
            return prompt, answer
        raise RuntimeError(f"{self.ref}: no task found for {split}/{seed}/{index}")  # pragma: no cover

    def grade(self, task: Task, answer: str, workspace: GradingWorkspace) -> Grade:
        expected = task.answer
        if isinstance(expected, bool) or not isinstance(expected, int):
            raise TypeError(f"{self.ref}: task {task.id} has no integer answer")
        found = last_number(answer if isinstance(answer, str) else "")
        if found is None:
            return Grade("invalid", 0.0, "the answer contains no number")
        value, shown = found
        if value == expected:
            return Grade("pass", 1.0, "the answer's final number matches the expected result")
        if len(shown) > _SHOWN_DIGITS:
            shown = shown[:_SHOWN_DIGITS] + "..."
        return Grade("fail", 0.0, f"the answer's final number {shown} is not the expected result")
