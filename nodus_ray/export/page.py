"""What the control plane answers an export call with: a light type, so the API process that
unpickles it loads no service module (decision 54)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ExportPage"]


@dataclass(frozen=True)
class ExportPage:
    """Part of an export: its bytes, their media type, and the page after it (None: the last)."""

    data: bytes
    media_type: str
    next_page: int | None = None
