"""Server settings, read once from the environment of ``nodus up``.

Only non-secret values live here; they are handed to actors explicitly so an actor never
depends on which process happened to start its worker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .storage import default_storage_uri

__all__ = ["NAMESPACE", "CONTROL_PLANE_NAME", "SERVE_APP_NAME", "ServerSettings"]

NAMESPACE = "nodus"
CONTROL_PLANE_NAME = "nodus-control-plane"
SERVE_APP_NAME = "nodus"


def _default_sandbox_root() -> str:
    # Sandboxed commands run as an unprivileged uid, which cannot traverse root's home (mode
    # 700): as root, workspaces live in /var/lib; otherwise in the user's own home.
    if os.geteuid() == 0:
        return "/var/lib/nodus/sandboxes"
    return str(Path.home() / ".nodus" / "sandboxes")


@dataclass(frozen=True)
class ServerSettings:
    storage_uri: str
    sandbox_root: str
    offline_latency_seconds: float = 0.0
    max_actor_restarts: int = 5

    @classmethod
    def from_env(cls) -> ServerSettings:
        return cls(
            storage_uri=default_storage_uri(),
            sandbox_root=os.environ.get("NODUS_SANDBOX_ROOT") or _default_sandbox_root(),
            offline_latency_seconds=float(os.environ.get("NODUS_OFFLINE_LATENCY", "0") or 0),
        )

    @property
    def model_backend(self) -> str:
        """The provider runs use: ``offline`` until the Anthropic provider is configured."""
        return "offline"
