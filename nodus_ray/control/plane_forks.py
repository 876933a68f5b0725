"""The control plane's fork verb: the facade's part for `forks.ForkService` (decision 58).

A mixin of `plane.ControlPlane`, apart so the facade stays a table of one-line delegations. It
imports no service at module level (every process holding a handle to the control plane loads
this module, decision 54): the service is built on first use from the facade's registry and runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nodus_ray.control.recovery import RecoveryGate, after_recovery

if TYPE_CHECKING:
    from nodus_ray.control.forks import ForkService
    from nodus_ray.control.registry import Registry
    from nodus_ray.control.runs import RunService

__all__ = ["ForkFacade"]


class ForkFacade:
    """``fork_run``: a new run from a step of another."""

    registry: Registry
    runs: RunService
    _forks: ForkService | None = None

    @property
    def recovery(self) -> RecoveryGate:  # pragma: no cover - the ControlPlane's own property wins
        raise NotImplementedError

    @after_recovery
    async def fork_run(
        self, project: str, name: str, at: str, new_name: str | None = None, new_input: str | None = None
    ) -> dict[str, Any]:
        from nodus_ray.control.forks import ForkRequest, ForkService

        if self._forks is None:
            self._forks = ForkService(self.registry, self.runs)
        return await self._forks.fork(project, name, ForkRequest(at=at, name=new_name, input=new_input))
