"""Secret values out of everything a run records: command output, model replies, the answer.

A run's commands may see secrets (an Agent's ``spec.env`` entries with ``secretKeyRef``), so
whatever they print could carry one. Each value is replaced by ``[REDACTED:<secret>/<key>]``
before it is journaled, shown to the model, written as the answer or streamed as an event;
since the model only ever sees redacted output, it cannot repeat a value it was never shown.

What it cannot catch, like every log masker (GitHub Actions' included): a value the command
transforms (base64, reversed, split across lines by the program) and values shorter than
`MIN_REDACTED_CHARS`, which would mask ordinary text. A multi-line value (a PEM key) is also
masked line by line, and a value cut in two by the output limit is masked at the cut.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MIN_REDACTED_CHARS", "Redactor"]

MIN_REDACTED_CHARS = 4
_MIN_LINE_CHARS = 8  # a line of a multi-line value is masked on its own from this length
_CUT = re.compile(r"\n\[output truncated: \d+ more bytes not shown\]")


class Redactor:
    """``redactor(text)`` masks every known value; ``redactor.tree(obj)`` every string inside."""

    def __init__(self, values: Mapping[str, str]) -> None:
        """``values``: label (``secret/KEY``) -> value."""
        pieces: dict[str, str] = {}
        for label, value in values.items():
            if len(value) >= MIN_REDACTED_CHARS:
                pieces.setdefault(value, label)
            if "\n" in value:
                for line in value.splitlines():
                    if len(line.strip()) >= _MIN_LINE_CHARS:
                        pieces.setdefault(line.strip(), label)
        self._labels = pieces
        ordered = sorted(pieces, key=len, reverse=True)  # the longest first: a value inside another
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def __repr__(self) -> str:
        return f"Redactor({len(self._labels)} values)"  # never the values

    def __call__(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        masked = self._pattern.sub(lambda match: f"[REDACTED:{self._labels[match.group(0)]}]", text)
        # Where the output limit cut the text, a value may be cut too: mask a piece of one there.
        cut = _CUT.search(masked)
        if cut is not None:
            masked = self._mask_cut_end(masked[: cut.start()]) + masked[cut.start() :]
        return masked

    def _mask_cut_end(self, text: str) -> str:
        """Mask a value's beginning at the end of ``text`` (the bytes after it were dropped)."""
        for value, label in self._labels.items():
            for size in range(min(len(value) - 1, len(text)), MIN_REDACTED_CHARS - 1, -1):
                if text.endswith(value[:size]):
                    return text[:-size] + f"[REDACTED:{label}]"
        return text

    def tree(self, value: Any) -> Any:
        """The same structure with every string masked (a model reply: text and tool inputs)."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self(value)
        if isinstance(value, list):
            return [self.tree(item) for item in value]
        if isinstance(value, dict):
            return {key: self.tree(item) for key, item in value.items()}
        return value
