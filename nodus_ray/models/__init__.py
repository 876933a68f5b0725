"""Model providers behind one interface, and the choice of which one serves a run."""

from __future__ import annotations

from typing import Any

from .base import BASH_TOOL, ModelError, ModelProvider, ModelRequest, ModelResponse, Usage
from .offline import OfflineProvider

__all__ = [
    "BASH_TOOL",
    "ModelError",
    "ModelProvider",
    "ModelRequest",
    "ModelResponse",
    "Usage",
    "OfflineProvider",
    "provider_for",
]


def provider_for(model_spec: dict[str, Any], *, latency_seconds: float = 0.0) -> ModelProvider:
    """The provider for an agent's ``spec.model``.

    Until the Anthropic provider is wired in, every run is served by the deterministic offline
    model, which needs no key and no network.
    """
    return OfflineProvider(latency_seconds=latency_seconds)
