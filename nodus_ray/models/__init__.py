"""Model providers behind one interface, and the choice of which one serves a run.

``base`` is the interface (requests, responses, usage), ``catalog`` which model serves each
family, ``anthropic_provider`` the official SDK and ``offline`` the deterministic model that
needs no key.

May import: ``core`` and the standard library, the ``anthropic`` SDK. Not ``money`` (prices
read the catalogue, not the providers), not Ray, not the sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nodus_ray.models.base import BASH_TOOL, ModelError, ModelProvider, ModelRequest, ModelResponse, Usage
from nodus_ray.models.offline import OfflineProvider

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


def provider_for(
    access: Mapping[str, Any], *, family_models: Mapping[str, str], latency_seconds: float = 0.0
) -> ModelProvider:
    """The provider the control plane's ``model_access`` answer names.

    ``anthropic`` when there is a key (the user's own for BYOK, else the server's); otherwise the
    deterministic offline model, which needs no key and no network.
    """
    if access.get("provider") == "anthropic":
        from nodus_ray.models.anthropic_provider import AnthropicProvider

        return AnthropicProvider(
            api_key=str(access["apiKey"]), base_url=access.get("baseUrl"), family_models=family_models
        )
    return OfflineProvider(latency_seconds=latency_seconds)
