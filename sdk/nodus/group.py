"""AgentGroups from Python: many runs of one agent under one limit, one cap and dependencies.

`AgentGroup` is the handle of a group (create, submit_many, seal, wait, runs, cancel, delete);
`agent_map.AgentMap`, what `Agent.map` returns, builds an ephemeral group on it. Everything here is HTTP through `nodus.client.Client`; tasks are checked (keys, cycles)
before anything is sent.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any, Self

from .agent import Agent
from .agent_run import AgentRun
from .client import Client
from .dependencies import DependencyCycle, dependency_order
from .errors import Invalid
from .handles import (
    _encode_input,
    _ResourceHandle,
    _unsupported,
    _usd,
)
from .resources import (
    API_VERSION,
    GROUP_TERMINAL_PHASES,
    MAX_BATCH_RUNS,
    member_run_name,
    parse_resource,
    validate_dns_label,
)
from .view import View

__all__ = ["AgentGroup"]


# -- AgentGroup -------------------------------------------------------------------------------

# The fields of one `AgentGroup.submit_many` task; anything else is refused rather than dropped.
_TASK_FIELDS = ("key", "input", "depends_on", "keep_alive", "labels")


def _whole_number(value: Any, arg: str) -> None:
    # pydantic would take True as 1; a limit written as a bool is a mistake, not a number.
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise Invalid(f"{arg} must be a whole number, not {type(value).__name__}", details={"field": arg})


def _group_manifest(
    name: str,
    agent: str,
    *,
    max_active: int | None = None,
    max_pending: int | None = None,
    max_cost: Any = None,
    evaluation: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The AgentGroup manifest, validated here so a bad limit is refused before anything is sent."""
    _whole_number(max_active, "max_active")
    _whole_number(max_pending, "max_pending")
    spec: dict[str, Any] = {"agent": agent}
    if evaluation is not None:
        if not isinstance(evaluation, Mapping):
            raise Invalid(
                'evaluation must be a dict such as {"environment": "nodus/arithmetic-v2@2.0.0", '
                '"tasks": 10, "seed": 42}',
                details={"field": "evaluation"},
            )
        for number in ("tasks", "repetitions", "seed"):
            _whole_number(evaluation.get(number), f"evaluation.{number}")
        spec["evaluation"] = dict(evaluation)
    limits = {
        key: value
        for key, value in (("maxActive", max_active), ("maxPending", max_pending))
        if value is not None
    }
    if limits:  # left out, the server's defaults apply (and stay its to change)
        spec["limits"] = limits
    cost = _usd(max_cost, "max_cost")
    if cost is not None:
        spec["maxCostUSD"] = cost
    manifest = {"apiVersion": API_VERSION, "kind": "AgentGroup", "metadata": {"name": name}, "spec": spec}
    parse_resource(manifest)
    return manifest


def _member_manifest(
    group: str,
    agent: str,
    key: str,
    text: str,
    depends_on: list[str],
    *,
    keep_alive: bool = False,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"agent": agent, "input": text, "group": group, "taskKey": key}
    if depends_on:
        spec["dependsOn"] = list(depends_on)
    if keep_alive:
        spec["keepAlive"] = True
    # No name: a member is named <group>-<taskKey> by the server (`member_run_name`).
    manifest: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "AgentRun", "spec": spec}
    if labels:
        manifest["metadata"] = {"labels": labels}
    return manifest


def _check_tasks(tasks: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[str], list[list[str]]]:
    """Keys, encoded inputs and dependencies of the tasks, or `Invalid` naming the first bad one."""
    if isinstance(tasks, (str, bytes, Mapping)) or not isinstance(tasks, Iterable):
        raise Invalid("tasks must be a list of {key, input, depends_on} dicts", details={"field": "tasks"})
    keys: list[str] = []
    texts: list[str] = []
    depends: list[list[str]] = []
    seen: dict[str, int] = {}
    for index, task in enumerate(tasks):
        where = f"tasks[{index}]"
        if not isinstance(task, Mapping):
            raise Invalid(f"{where} must be a dict with key, input and depends_on", details={"field": where})
        unknown = [field for field in task if field not in _TASK_FIELDS]
        if unknown:
            raise Invalid(
                f"{where}: unknown field {unknown[0]!r}; a task has key, input, depends_on, keep_alive and labels",
                details={"field": f"{where}.{unknown[0]}"},
            )
        if "key" not in task:
            raise Invalid(f"{where} has no key", details={"field": f"{where}.key"})
        key = task["key"]
        try:
            validate_dns_label(key)
        except ValueError as exc:
            raise Invalid(f"{where}.key: {exc}", details={"field": f"{where}.key"}) from None
        if key in seen:
            raise Invalid(
                f"task key {key!r} is repeated (tasks[{seen[key]}] and {where}); keys are unique in a group",
                details={"field": f"{where}.key", "key": key},
            )
        seen[key] = index
        raw = task.get("depends_on")
        if raw is None:
            raw = []
        elif not isinstance(raw, (list, tuple)):  # a bare string would read as one key per letter
            raise Invalid(
                f"{where}.depends_on must be a list of task keys", details={"field": f"{where}.depends_on"}
            )
        deps: list[str] = []
        for position, dep in enumerate(raw):
            try:
                validate_dns_label(dep)
            except ValueError as exc:
                field = f"{where}.depends_on[{position}]"
                raise Invalid(f"{field}: {exc}", details={"field": field}) from None
            if dep not in deps:
                deps.append(dep)
        try:
            text = _encode_input(task.get("input"))
        except Invalid as exc:
            raise Invalid(f"{where}.input: {exc.message}", details={"field": f"{where}.input"}) from None
        keys.append(key)
        texts.append(text)
        depends.append(deps)
    return keys, texts, depends


def _keep_alive_flags(tasks: list[Mapping[str, Any]]) -> list[bool]:
    """Each task's ``keep_alive`` (default False), or `Invalid` naming the first that is no bool."""
    flags: list[bool] = []
    for index, task in enumerate(tasks):
        flag = task.get("keep_alive", False)
        if not isinstance(flag, bool):
            raise Invalid(
                f"tasks[{index}].keep_alive must be True or False",
                details={"field": f"tasks[{index}].keep_alive"},
            )
        flags.append(flag)
    return flags


def _dependency_order(keys: list[str], depends: list[list[str]]) -> list[int]:
    """Task indexes with each task after the tasks of this call it depends on; raises on a cycle.

    Stable: among the tasks that are free to go, the caller's earlier one goes first, so a
    call without dependencies is sent exactly in the caller's order. Dependencies on keys not in
    this call are left to the server (they may be in the group from an earlier call). The order
    and the cycle named are `nodus.dependencies`', which the server's admission uses too.
    """
    try:
        return dependency_order(keys, depends)
    except DependencyCycle as exc:
        cycle = list(exc.cycle.keys)
        raise Invalid(exc.cycle.message, details={"field": "depends_on", "cycle": cycle}) from None


class AgentGroup(_ResourceHandle):
    """Runs of one Agent under a shared concurrency limit and cost cap, with task dependencies and one cancel.

    Create it with `create` (or take an existing one with `from_name`), add tasks with
    `submit_many`, `seal` it once no more are coming, then `wait` for its terminal status and
    read `runs`. `delete` removes the group with its runs, so call it when done.
    """

    _collection = "agentgroups"
    _kind = "AgentGroup"

    @classmethod
    def create(
        cls,
        name: str,
        agent: Agent | str,
        *,
        max_active: int | None = None,
        max_pending: int | None = None,
        max_held: int | None = None,
        max_cost: Any = None,
        evaluation: dict[str, Any] | None = None,
        project: str | None = None,
        client: Client | None = None,
    ) -> Self:
        """Create the group; `max_active` runs go at once and runs are released while `max_cost` has room.

        ``agent`` is an `Agent` (deployed first if `Agent.deploy` was not called; its client and
        project are used unless given) or the name of a deployed agent. ``max_cost`` caps the
        runs' Claude usage together; their sandboxes are billed apart. Raises `errors.Conflict`
        (``AlreadyExists``) when the name is taken. ``max_held`` raises `errors.Unsupported`
        before anything is sent.

        ``evaluation={"environment": "nodus/arithmetic-v2@2.0.0", "tasks": 10, "seed": 42}``
        makes an evaluation group: the server generates the Environment's fixed task batch
        (``split`` "test", ``repetitions`` 1, ``timeout`` "30m" unless given), runs it and
        grades the answers; there is nothing to submit or seal. Read `results` after `wait`.
        """
        if max_held is not None:
            raise _unsupported("AgentGroup.create(max_held=...)", "the API does not hold workers", "max_held")
        if isinstance(agent, Agent):
            agent_name = agent.name
            project = project if project is not None else agent._project
        elif isinstance(agent, str):
            agent_name = agent
        else:
            raise Invalid("agent must be an Agent or the name of one", details={"field": "agent"})
        manifest = _group_manifest(
            name,
            agent_name,
            max_active=max_active,
            max_pending=max_pending,
            max_cost=max_cost,
            evaluation=evaluation,
        )
        if isinstance(agent, Agent):
            client = client or agent.client
            agent._ensure_deployed()
        client = client or Client(project=project)
        created = client.create("agentgroups", manifest, project=project)
        return cls(created, project=project, client=client)

    def _identity(self) -> tuple[str, str]:
        """The group's agent and uid, read from the server when this handle has not seen them.

        The uid goes into the batch idempotency keys: a group deleted and created again under
        the same name must not get the first group's batches answered from the server's memory.
        """
        if not (self._resource.get("spec") or {}).get("agent") or not (
            self._resource.get("metadata") or {}
        ).get("uid"):
            self._refresh()
        agent = (self._resource.get("spec") or {}).get("agent")
        if not isinstance(agent, str):
            raise Invalid(f"agentgroup/{self.name} names no agent", details={"field": "spec.agent"})
        return agent, str((self._resource.get("metadata") or {}).get("uid") or "")

    def _batch_key(self, uid: str, batch: list[dict[str, Any]]) -> str:
        """The batch's Idempotency-Key: the same batch of the same group always gets the same key.

        So a call retried after a lost answer (or a crash) gets the runs it created the first
        time instead of a second set, and different batches never share a key.
        """
        content = {
            "project": self._project or self._client.project,
            "group": self.name,
            "uid": uid,
            "items": batch,
        }
        encoded = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(encoded.encode("utf-8")).hexdigest()

    def submit_many(self, tasks: Iterable[Mapping[str, Any]]) -> list[AgentRun]:
        """Create one run per task ``{key, input, depends_on?, keep_alive?, labels?}`` and return them
        in the caller's order (``labels``: the run's ``metadata.labels``).

        A ``keep_alive`` task's run waits for messages after each answer (``run.send``) instead
        of finishing; while it waits it holds its cost reservation but no ``max_active`` place,
        and the group stays Running until it ends (a cancel, its deadline; docs/groups.md).

        A task starts after the tasks in ``depends_on``, which name tasks of this call or of an
        earlier one. Runs are sent with every task after the tasks of this call it depends on,
        in `AgentRunList` batches of up to 100 (each batch all-or-nothing, with an idempotency
        key from its content, so calling again with the same tasks creates nothing twice). A
        repeated key, a key that is not a DNS label, an unknown task field or a cycle raises
        `errors.Invalid` before anything is sent.
        """
        if isinstance(tasks, Iterable) and not isinstance(tasks, (str, bytes, Mapping)):
            tasks = list(tasks)  # read twice: the checks, then each task's keep_alive
        keys, texts, depends = _check_tasks(tasks)
        alive = _keep_alive_flags(list(tasks))
        labels = [task.get("labels") for task in tasks]
        if not keys:
            return []
        order = _dependency_order(keys, depends)
        agent, uid = self._identity()
        manifests: dict[str, dict[str, Any]] = {}
        for position in order:
            manifest = _member_manifest(
                self.name,
                agent,
                keys[position],
                texts[position],
                depends[position],
                keep_alive=alive[position],
                labels=labels[position],
            )
            try:  # an oversized input or a too-long run name is refused before the first batch goes
                parse_resource(manifest)
            except Invalid as exc:
                raise type(exc)(
                    f"tasks[{position}]: {exc.message}",
                    code=exc.code,
                    details={**exc.details, "index": position},
                ) from None
            manifests[keys[position]] = manifest
        sent = list(manifests.values())
        created: dict[str, dict[str, Any]] = {}
        for start in range(0, len(sent), MAX_BATCH_RUNS):
            batch = sent[start : start + MAX_BATCH_RUNS]
            key = self._batch_key(uid, batch)
            answer = self._client.create_runs(batch, idempotency_key=key, project=self._project)
            for resource in answer:
                name = (resource.get("metadata") or {}).get("name") if isinstance(resource, dict) else None
                if isinstance(name, str):
                    created[name] = resource
        handles = []
        for key in keys:
            name = member_run_name(self.name, key)
            resource = created.get(name) or {**manifests[key], "metadata": {"name": name}}
            handles.append(AgentRun(resource, project=self._project, client=self._client))
        return handles

    def seal(self) -> None:
        """Close the group to new runs; it finishes once every run is terminal (and not before)."""
        patched = self._client.patch(
            "agentgroups", self.name, {"spec": {"sealed": True}}, project=self._project
        )
        if isinstance(patched, dict) and patched.get("metadata"):
            self._resource = patched

    def cancel(self) -> None:
        """Cancel every unfinished run in the group; finished runs keep their answers."""
        cancelled = self._client.cancel_group(self.name, project=self._project)
        if isinstance(cancelled, dict) and cancelled.get("metadata"):
            self._resource = cancelled

    def delete(self) -> None:
        """Delete the group and, with it, its runs (unfinished ones are cancelled)."""
        self._client.delete("agentgroups", self.name, project=self._project)

    def wait(self, timeout: float | None = None) -> View:
        """Block until the group is terminal and return its status (``phase``, ``counts``, ``cost``).

        Returns for Failed and Cancelled too: a group is a batch, and which runs failed is read
        from `runs`. A group finishes only once it is sealed, so waiting on an unsealed group
        waits until someone seals it (or ``timeout``, which raises `errors.WaitTimeout`). A briefly
        unreachable API (a server restart) is waited out.
        """

        def still(phase: str) -> str:
            spec = self._resource.get("spec") or {}
            unsealed = phase != "unknown" and not spec.get("sealed") and not spec.get("evaluation")
            hint = "; it is not sealed, and finishes only once sealed" if unsealed else ""
            return f"agentgroup/{self.name} is still {phase} after {timeout:g}s{hint}"

        return View(self._poll_status(lambda now: now.get("phase") in GROUP_TERMINAL_PHASES, timeout, still))

    def runs(
        self, *, labels: Mapping[str, str] | str | None = None, phase: str | None = None
    ) -> list[AgentRun]:
        """The group's member runs, in creation order; ``labels`` (a dict or a selector such as
        ``"team=a,env!=prod"``) and ``phase`` select on the server, a page at a time."""
        if labels is not None or phase is not None:
            from .listing import list_runs

            return list_runs(
                group=self.name, labels=labels, phase=phase, project=self._project, client=self._client
            )
        items = self._client.group_runs(self.name, project=self._project)
        return [AgentRun(item, project=self._project, client=self._client) for item in items]

    def results(self) -> list[View]:
        """One record per case of an evaluation group, in case order, as the server has it now.

        Each has ``task_id``, ``repetition``, ``run``, ``state`` (Pending, Grading, Scored or
        an unscored state such as RunFailed), ``verdict``, ``reward`` and the grader's
        ``evidence``; never the task's payload or its hidden answer. Raises `errors.Conflict`
        (``NotAnEvaluation``) for a group that is not an evaluation.
        """
        answer = self._client.group_results(self.name, project=self._project)
        return [View(item) for item in answer.get("items") or []]

    def compare(self, other: AgentGroup | str) -> View:
        """This evaluation minus ``other`` (same Environment version, split, seed and tasks), per
        task scored in both: ``pass_rate`` and ``mean_reward``, each with ``difference``,
        ``standard_error``, ``ci95`` and ``n`` (docs/evaluation.md#statistics). Raises
        `errors.Conflict` (``NotSameBatch``, naming what differs) for two different batches."""
        name = other.name if isinstance(other, AgentGroup) else other
        return View(self._client.compare_evaluations(self.name, name, project=self._project))

    def export(self, format: str = "inspect", *, to: str | os.PathLike[str] | None = None) -> bytes | int:
        """An evaluation's cases as ``inspect`` (Inspect's eval log), ``jsonl`` or ``parquet``:
        its bytes, or with ``to`` the bytes written to that file (docs/export.md)."""
        return self._client.export_evaluation(self.name, format, to=to, project=self._project)


# -- Agent.map --------------------------------------------------------------------------------
