"""Arithmetic without ``eval``: which numbers a prompt asks to compute, and their values.

Parsed with :mod:`ast` and evaluated node by node; huge, complex or undefined results are
refused in words.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from typing import Any

__all__ = ["_arithmetic_answer", "_find_expressions"]

_MAX_RESULT_BITS = 4000  # larger integers are refused (they would not be "one short sentence")
_MAX_EXPRESSION_CHARS = 200


_WORD_OPERATORS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.I), symbol)
    for pattern, symbol in (
        (r"\bmultiplied\s+by\b", "*"),
        (r"\btimes\b", "*"),
        (r"\bdivided\s+by\b", "/"),
        (r"\bplus\b", "+"),
        (r"\bminus\b", "-"),
        (r"\bmod(?:ulo)?\b", "%"),
        (r"\s*\bto\s+the\s+power\s+of\b\s*", "**"),
        (r"\s*\bsquared\b", "**2"),
        (r"\s*\bcubed\b", "**3"),
        (r"(?<=[\d)])\s+x\s+(?=[\d(])", " * "),
        (r"×", "*"),
        (r"÷", "/"),
        (r"−", "-"),
    )
)
_CANDIDATE_RE = re.compile(r"(?:[-+(]\s*)*[\d.][\d.\s()+\-*/%^]*")

# When numbers with an operator count as a question (see :func:`_find_expressions`).
_ARITHMETIC_LEAD = r"(?:what\s+is|what's|whats|compute|calculate|evaluate|how\s+much\s+is|solve)"
_LEAD_BEFORE_RE = re.compile(rf"\b{_ARITHMETIC_LEAD}\s*:?\s*$", re.I)
_WRAPPER_BEFORE_RE = re.compile(
    rf"\s*(?:(?:please|kindly|hey|ok|okay|so|can\s+you|could\s+you|would\s+you|will\s+you|{_ARITHMETIC_LEAD})"
    r"\b[\s,:]*)*",
    re.I,
)
_WRAPPER_AFTER_RE = re.compile(
    r"(?:\s*=)?(?:\s+(?:in|inside|using|with|via|on)\s+(?:the\s+|your\s+|my\s+|a\s+)?"
    r"(?:shell|bash|terminal|sandbox|workspace|command\s+line))?"
    r"(?:[\s?.!,]|\bplease\b|\bfor\s+me\b)*",
    re.I,
)
_LEADING_DOTS_RE = re.compile(r"(?:\.(?!\d)|\s)*")
_JOINER_RE = re.compile(r"[\s,;&]*(?:and\b)?[\s,;&]*", re.I)
# Number shapes that are not sums: dates and phone numbers (2024-01-05, 555-123-4567), versions and
# dotted numbers (3.11.2), and slashed dates with a four-digit year (1/5/2024, 2024/01/05).
_NOT_ARITHMETIC_RE = re.compile(
    r"\d-\d+-\d|\d*\.\d+\.\d|\b\d{1,2}/\d{1,2}/(?:1[89]|2\d)\d\d\b|\b(?:1[89]|2\d)\d\d/\d{1,2}/\d{1,2}\b"
)

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


class _Refused(ValueError):
    """An expression that parses but will not be computed; the message says why, in words."""


def _arithmetic_answer(prompt: str) -> str | None:
    found = _find_expressions(prompt)
    if not found:
        return None
    parts = []
    for shown, tree in found[:5]:
        try:
            parts.append(f"{shown} = {_format_number(_evaluate(tree))}")
        except _Refused as why:
            parts.append(f"I can't compute {shown}: {why}")
    return "; ".join(parts) + "."


def _find_expressions(text: str) -> list[tuple[str, ast.Expression]]:
    """The arithmetic the text asks for, as (shown form, parsed tree); empty when it asks none.

    An expression (at least one binary operator) counts only when it is clearly the question:
    either the whole text is expressions (joined by "and", "," or ";") once polite wrappers are
    stripped ("what is", "compute", "please", a trailing "?" or "." or "in the shell"), or
    "what is", "what's", "compute", "calculate", "evaluate", "how much is" or "solve" directly
    precedes it (or precedes an expression it is joined to by "and"). So "Plan a 2-3 day trip"
    is not arithmetic. Dates, phone numbers and version numbers (2024-01-05, 555-123-4567,
    3.11.2) are never evaluated.
    """
    for pattern, symbol in _WORD_OPERATORS:
        text = pattern.sub(symbol, text)
    spans = _expression_spans(text)
    if not spans:
        return []
    if _only_expressions(text, spans):
        return [(shown, tree) for _, _, shown, tree in spans]
    found, previous_end = [], None
    for start, end, shown, tree in spans:
        before = text[:start]
        chained = previous_end is not None and _JOINER_RE.fullmatch(text[previous_end:start])
        if chained or _LEAD_BEFORE_RE.search(before):
            found.append((shown, tree))
            previous_end = end
        else:
            previous_end = None
    return found


def _expression_spans(text: str) -> list[tuple[int, int, str, ast.Expression]]:
    """Every arithmetic expression in the text: (start, end, shown form, parsed tree)."""
    spans = []
    for match in _CANDIDATE_RE.finditer(text):
        raw = match.group()
        leading = _LEADING_DOTS_RE.match(raw)  # a sentence's "." before the number
        lead = leading.end() if leading else 0
        candidate = _trim_candidate(raw[lead:])
        if not candidate or len(candidate) > _MAX_EXPRESSION_CHARS or _NOT_ARITHMETIC_RE.search(candidate):
            continue
        tree = _parse(candidate)
        if tree is not None and any(isinstance(node, ast.BinOp) for node in ast.walk(tree)):
            start = match.start() + lead
            spans.append((start, start + len(candidate), " ".join(candidate.split()), tree))
    return spans


def _only_expressions(text: str, spans: list[tuple[int, int, str, ast.Expression]]) -> bool:
    """Whether the text is nothing but the expressions, joiners and polite wrappers."""
    if not _WRAPPER_BEFORE_RE.fullmatch(text[: spans[0][0]]):
        return False
    if not _WRAPPER_AFTER_RE.fullmatch(text[spans[-1][1] :]):
        return False
    return all(
        _JOINER_RE.fullmatch(text[left[1] : right[0]]) for left, right in zip(spans, spans[1:], strict=False)
    )


def _trim_candidate(candidate: str) -> str:
    """Drop trailing punctuation and unmatched closing parentheses."""
    candidate = candidate.rstrip()
    while candidate and (candidate[-1] not in "0123456789)" or candidate.count(")") > candidate.count("(")):
        candidate = candidate[:-1].rstrip()
    return candidate


def _parse(candidate: str) -> ast.Expression | None:
    try:
        tree = ast.parse(candidate.replace("^", "**"), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return tree if _only_arithmetic(tree) else None


def _only_arithmetic(tree: ast.AST) -> bool:
    allowed_ops = (*_BINARY, ast.Pow, ast.USub, ast.UAdd)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if type(node.value) not in (int, float):
                return False
        elif isinstance(node, ast.BinOp | ast.UnaryOp):
            if not isinstance(node.op, allowed_ops):
                return False
        elif not isinstance(node, ast.Expression | ast.operator | ast.unaryop):
            return False
    return True


def _evaluate(node: ast.AST) -> int | float:
    """Evaluate a tree that ``_only_arithmetic`` accepted, refusing huge or undefined results."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):  # as _only_arithmetic checked
        return node.value
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left), _evaluate(node.right)
        try:
            if isinstance(node.op, ast.Pow):
                return _checked(_power(left, right))
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise _Refused("division by zero is undefined") from None
        except OverflowError:
            raise _Refused("the result is too large") from None
    raise _Refused("only numbers and + - * / // % ** are allowed")


def _power(base: int | float, exponent: int | float) -> int | float | complex:
    """``base ** exponent``, refused before computing when the result would be enormous."""
    if abs(base) > 1 and exponent > 0 and exponent * math.log2(abs(base)) > _MAX_RESULT_BITS:
        raise _Refused("the result is too large")
    if base == 0 and exponent < 0:
        raise ZeroDivisionError
    return base**exponent


def _checked(value: int | float | complex) -> int | float:
    if isinstance(value, complex):
        raise _Refused("the result is not a real number")
    if isinstance(value, int) and value.bit_length() > _MAX_RESULT_BITS:
        raise _Refused("the result is too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise _Refused("the result is too large")
    return value


def _format_number(value: int | float) -> str:
    """Integers as integers; floats as a clean decimal (3.0 -> "3", 1/3 -> "0.333333333333")."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".12g")
