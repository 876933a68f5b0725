"""The Serve deployment of the API: ``serve run nodus_serve.deployment:app`` or `nodus up`.

``max_ongoing_requests`` is raised well above Serve's default of 5, because a few slow
requests (a large journal read) must not stall every other client.
"""

from __future__ import annotations

from ray import serve

from .app import create_app
from .ingress import replica_env

__all__ = ["NodusIngress", "app", "build"]

fastapi_app = create_app()
_REPLICA_ENV = replica_env()


@serve.deployment(
    name="nodus-api",
    num_replicas=1,
    # Above the app's own limit (NODUS_API_MAX_INFLIGHT, default 128), which answers 429 past
    # it: Serve's queue would only hold requests longer, and event streams are not counted.
    max_ongoing_requests=1024,
    # HAProxy's direct ingress, when the controller runs it (`ingress`): Serve reads these
    # when the replica's process starts.
    ray_actor_options={
        "num_cpus": 0,
        **({"runtime_env": {"env_vars": _REPLICA_ENV}} if _REPLICA_ENV else {}),
    },
)
@serve.ingress(fastapi_app)
class NodusIngress:
    """Stateless: every resource lives in the control plane and storage."""

    def __repr__(self) -> str:
        return "NodusIngress(api=/v1)"


def build() -> serve.Application:
    application: serve.Application = NodusIngress.bind()  # type: ignore[attr-defined]  # added by @serve.deployment
    return application


app = build()
