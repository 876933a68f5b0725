"""The one Ray boundary of run supervision: finding, starting and ending run actors.

`RunSupervisor` goes through a `RunActorLauncher` only, so it is tested without Ray over a
fake launcher (tests/unit/test_control_support.py); `RayRunActors` is the real one, detached
named actors in the service's namespace, sized by the Agent's spec.
"""

from __future__ import annotations

from typing import Any, Protocol

import ray

from nodus_ray.runtime.run_actor import RemoteRunActor, RunConfig
from nodus_ray.runtime.run_config import actor_resources
from nodus_ray.settings import NAMESPACE

__all__ = ["RayRunActors", "RunActorLauncher"]


class RunActorLauncher(Protocol):
    """Finding, starting and ending run actors (Ray's, or a test's fakes)."""

    def find(self, name: str) -> Any | None: ...

    def start(self, name: str, config: RunConfig) -> Any: ...

    def kill(self, actor: Any) -> None: ...


class RayRunActors:
    """Run actors as detached, named Ray actors in the service's namespace."""

    def find(self, name: str) -> Any | None:
        try:
            return ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return None

    def start(self, name: str, config: RunConfig) -> Any:
        return RemoteRunActor.options(
            name=name,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            **actor_resources(config.agent_spec),
        ).remote(config)

    def kill(self, actor: Any) -> None:
        ray.kill(actor, no_restart=True)
