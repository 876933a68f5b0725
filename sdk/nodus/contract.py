"""Plain values of the API contract, apart from the schemas that use them.

`schema_common` defines the pydantic models and re-exports these; the engine's run actor takes
them from here, so a run's process does not import pydantic to learn the model families
(issue 19).
"""

from __future__ import annotations

from typing import Final

__all__ = ["API_VERSION", "FAMILIES", "MAX_INPUT_BYTES", "ANSWER_PREVIEW_BYTES"]

API_VERSION: Final = "nodus.dev/v1"
FAMILIES: tuple[str, ...] = ("haiku", "sonnet", "opus", "fable")
MAX_INPUT_BYTES = 256 * 1024
ANSWER_PREVIEW_BYTES = 4 * 1024
