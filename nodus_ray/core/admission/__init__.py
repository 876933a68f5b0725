"""AgentGroup admission: which queued runs start now, which are cancelled, and the group's status.

This is the decision core of a group. A "group supervisor" actor wraps it, performs the
decisions (starts and cancels runs) and reports back what the runs do. The module is pure
Python: no Ray, no I/O, no clock, no randomness. Everything it decides follows from the
limits, the sealed/cancelled flags and the members' states, so after a restart
`Admission.rebuild` reconstructs the same object from the runs' recorded phases; the
supervisor persists nothing itself.

The rules (the Agents guide, "Run agents in parallel"):

* A queued run starts when, in this order: every run it depends on has succeeded; fewer than
  ``limits.max_active`` runs are started and unfinished (Active or Waiting: a run waiting for a
  message or for credits keeps its slot); and its own cap fits under what is left of the group
  cap (cap minus everything spent minus the reservations of the started, unfinished runs).
  A started run reserves its remaining allowance ``max(cap - spent, 0)``; since a run's spend
  never passes its cap, spent + reserved never passes the group cap, whatever the runs do.
* Eligible runs are taken in creation order. A run whose cap does not fit is skipped and a later,
  smaller one may start (first fit): with one agent per group all caps are equal, so this is plain
  FIFO; with mixed caps (an agent edited between creations, or BYOK runs at cap 0) it keeps the
  group busy instead of idling behind one large run. The price is that a large run can keep
  waiting while smaller ones spend what is left; the status message says when it is stuck.
* A failed dependency cancels its queued dependents with ``DependencyFailed``, a cancelled one
  with ``DependencyCancelled``; the cascade is transitive (the dependent of a cancelled dependent
  is ``DependencyCancelled``). When one run has both, ``DependencyFailed`` wins.
* The group is Running until it is sealed and every run is terminal, then Succeeded, or Failed
  with ``RunsFailed`` when a run failed or was cancelled because a dependency failed. A run
  cancelled by its user (or ``DependencyCancelled`` because of one) does not fail the group.
  After a group cancel the phase is Cancelling until every run is terminal, then Cancelled.

Delivery of decisions: every call that returns a `Decision` hands out the starts and cancels
made since the previous Decision, exactly once. Admission marks a run Active the moment it puts
it in ``Decision.start`` (and reserves its cap then), so no later decision can start it again
and its cap is never reserved twice. `Admission.started` acknowledges the start; runs admitted
and not yet acknowledged are in `Admission.unconfirmed` for a supervisor that must retry. After a
restart a run whose start never happened reads back as Queued and is admitted again, so starting
a run must be idempotent by run name.

Modules: :mod:`.model` (states, reasons, limits, members, decisions, status), :mod:`.errors`
(`AdmissionError`), :mod:`.checks` (what a member or batch must pass; cycles through
:mod:`nodus.dependencies`), :mod:`.ledger` (counts, spend, reservations and the admission
pass), :mod:`.status` (the group's status), :mod:`.state` (`Admission`).
"""

from nodus_ray.core.admission.errors import AdmissionError
from nodus_ray.core.admission.model import Decision, GroupLimits, GroupStatus, Member
from nodus_ray.core.admission.state import Admission

__all__ = ["GroupLimits", "Member", "Admission", "Decision", "AdmissionError", "GroupStatus"]
