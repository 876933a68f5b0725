"""AgentGroups from Python: many runs of one agent under one limit, one cap and dependencies.

`AgentGroup` is the handle of a group (create, submit_many, seal, wait, runs, cancel, delete);
`AgentMap` is what `Agent.map` returns: an ephemeral group that yields answers and deletes
itself. Everything here is HTTP through `nodus.client.Client`; tasks are checked (keys, cycles)
before anything is sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import json
import secrets as _secrets
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Self

from .agent import (
    _POLL_FIRST_DELAY,
    _POLL_MAX_DELAY,
    _UNAVAILABLE_GRACE,
    Agent,
    AgentRun,
    View,
    _encode_input,
    _ResourceHandle,
    _run_failed,
    _run_name,
    _unsupported,
    _usd,
)
from .client import Client
from .errors import AgentRunFailed, Conflict, Invalid, NotFound, Unavailable
from .resources import (
    API_VERSION,
    GROUP_TERMINAL_PHASES,
    MAX_BATCH_RUNS,
    TERMINAL_PHASES,
    at_cost_cap,
    member_run_name,
    parse_resource,
    validate_dns_label,
)

__all__ = ["AgentGroup", "AgentMap"]


# -- AgentGroup -------------------------------------------------------------------------------

# The fields of one `AgentGroup.submit_many` task; anything else is refused rather than dropped.
_TASK_FIELDS = ("key", "input", "depends_on")


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


def _member_manifest(group: str, agent: str, key: str, text: str, depends_on: list[str]) -> dict[str, Any]:
    spec: dict[str, Any] = {"agent": agent, "input": text, "group": group, "taskKey": key}
    if depends_on:
        spec["dependsOn"] = list(depends_on)
    # No metadata: a member is named <group>-<taskKey> by the server (`member_run_name`).
    return {"apiVersion": API_VERSION, "kind": "AgentRun", "spec": spec}


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
                f"{where}: unknown field {unknown[0]!r}; a task has key, input and depends_on",
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


def _dependency_order(keys: list[str], depends: list[list[str]]) -> list[int]:
    """Task indexes with each task after the tasks of this call it depends on; raises on a cycle.

    Stable: among the tasks that are free to go, the caller's earlier one goes first, so a
    call without dependencies is sent exactly in the caller's order. Dependencies on keys not in
    this call are left to the server (they may be in the group from an earlier call).
    """
    index = {key: position for position, key in enumerate(keys)}
    waiting = [0] * len(keys)
    dependents: list[list[int]] = [[] for _ in keys]
    for position, deps in enumerate(depends):
        for dep in deps:
            if dep in index:
                waiting[position] += 1
                dependents[index[dep]].append(position)
    ready = [position for position, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        position = heapq.heappop(ready)
        order.append(position)
        for dependent in dependents[position]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                heapq.heappush(ready, dependent)
    if len(order) == len(keys):
        return order
    # Every task left waits on another task left, so following first dependencies must loop.
    left = {position for position, count in enumerate(waiting) if count > 0}
    path = [min(left)]
    seen = {path[0]: 0}
    while True:
        step = next(index[dep] for dep in depends[path[-1]] if index.get(dep) in left)
        if step in seen:
            cycle = [keys[position] for position in path[seen[step] :]] + [keys[step]]
            raise Invalid(
                f"dependency cycle: {' -> '.join(cycle)}", details={"field": "depends_on", "cycle": cycle}
            )
        seen[step] = len(path)
        path.append(step)


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
        """Create one run per task ``{key, input, depends_on?}`` and return them in the caller's order.

        A task starts after the tasks in ``depends_on``, which name tasks of this call or of an
        earlier one. Runs are sent with every task after the tasks of this call it depends on,
        in `AgentRunList` batches of up to 100 (each batch all-or-nothing, with an idempotency
        key from its content, so calling again with the same tasks creates nothing twice). A
        repeated key, a key that is not a DNS label, an unknown task field or a cycle raises
        `errors.Invalid` before anything is sent.
        """
        keys, texts, depends = _check_tasks(tasks)
        if not keys:
            return []
        order = _dependency_order(keys, depends)
        agent, uid = self._identity()
        manifests: dict[str, dict[str, Any]] = {}
        for position in order:
            manifest = _member_manifest(self.name, agent, keys[position], texts[position], depends[position])
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

    def runs(self) -> list[AgentRun]:
        """The group's member runs, in creation order."""
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


# -- Agent.map --------------------------------------------------------------------------------

_DONE = object()  # the end of a map, passed back from the worker thread of `async for`


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


class _Progress:
    """A progress bar on stderr while `Agent.map` runs, shown only when stderr is a terminal."""

    def __init__(self, total: int, label: str) -> None:
        self._bar: Any = None
        if not _isatty(sys.stderr):
            return
        try:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        except ImportError:  # pragma: no cover - rich is a dependency; a bar is not worth failing for
            return
        # Lines printed to stdout go above the bar only when stdout is that terminal too; piped
        # output must stay on stdout, untouched.
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            redirect_stdout=_isatty(sys.stdout),
            redirect_stderr=False,
        )
        self._task = self._bar.add_task(label, total=total)
        self._bar.start()

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _delete_quietly(group: AgentGroup) -> None:
    """Delete a map's group without hiding what ended the map: a failure here is only warned about."""
    try:
        group.delete()
    except NotFound:
        pass
    except Exception as exc:
        warnings.warn(
            f"could not delete agentgroup/{group.name} after map ({exc}); "
            f"delete it with AgentGroup.from_name({group.name!r}).delete()",
            RuntimeWarning,
            stacklevel=2,
        )


def _finished_runs(
    group: AgentGroup, keys: list[str], order_outputs: bool, progress: _Progress
) -> Iterator[str | AgentRunFailed]:
    """Each task's answer text or failure as its run finishes, polling the group's runs in one list call."""
    client, project = group._client, group._project
    key_of = {member_run_name(group.name, key): key for key in keys}
    pending = set(keys)
    finished: dict[str, str | AgentRunFailed] = {}
    position = 0  # the next key to yield in input order
    delay = min(_POLL_FIRST_DELAY, _POLL_MAX_DELAY)
    unreachable_since: float | None = None
    while pending:
        newly: list[str | AgentRunFailed] = []
        try:
            items = client.group_runs(group.name, project=project)
            if not items:  # nothing listed at all: the group was deleted under the map, say so
                group._refresh()
            for item in items:
                name = (item.get("metadata") or {}).get("name")
                key = key_of.get(name) if isinstance(name, str) else None
                if key is None or key not in pending:
                    continue
                status = item.get("status") or {}
                phase = status.get("phase")
                outcome: str | AgentRunFailed
                if phase == "Succeeded":
                    try:
                        outcome = str(client.run_answer(name, project=project).get("answer") or "")
                    except Conflict as exc:
                        if exc.code != "AnswerNotReady":
                            raise
                        continue  # stored a moment after the phase; the next poll has it
                elif phase in TERMINAL_PHASES or at_cost_cap(status):
                    outcome = _run_failed(name, status)
                else:
                    continue
                pending.discard(key)
                progress.advance()
                if order_outputs:
                    finished[key] = outcome
                else:
                    newly.append(outcome)
            unreachable_since = None
        except Unavailable:
            now = time.monotonic()
            unreachable_since = unreachable_since or now
            if now - unreachable_since > _UNAVAILABLE_GRACE:
                raise
        yield from newly
        while position < len(keys) and keys[position] in finished:
            yield finished.pop(keys[position])
            position += 1
        if pending:
            time.sleep(delay)
            delay = min(delay * 1.5, _POLL_MAX_DELAY)


def _map_answers(
    agent: Agent,
    group_name: str,
    keys: list[str],
    texts: list[str],
    max_active: int | None,
    order_outputs: bool,
    return_exceptions: bool,
) -> Iterator[Any]:
    # A plain function, not a method of AgentMap: the generator must not reference its owner, so
    # dropping the AgentMap (a `break`) finalizes the generator at once and its `finally` deletes
    # the group then, not at some later garbage collection.
    if not keys:
        return
    group = AgentGroup.create(group_name, agent, max_active=max_active)
    progress: _Progress | None = None
    try:
        group.submit_many([{"key": key, "input": text} for key, text in zip(keys, texts, strict=True)])
        group.seal()
        progress = _Progress(len(keys), f"{agent.name} map")
        for outcome in _finished_runs(group, keys, order_outputs, progress):
            if isinstance(outcome, AgentRunFailed) and not return_exceptions:
                raise outcome
            yield outcome
    finally:
        if progress is not None:
            progress.stop()
        _delete_quietly(group)


class AgentMap(Iterator[Any]):
    """The answers of `Agent.map`, for ``for`` and ``async for`` alike.

    Nothing is sent until the first answer is asked for. ``close()`` (or leaving a ``with`` /
    ``async with`` block, or dropping the iterator after a ``break``) deletes the group and
    cancels its unfinished runs. ``async for`` runs each polling step in a worker thread, so the
    event loop is not blocked while runs finish.
    """

    def __init__(
        self,
        agent: Agent,
        inputs: Iterable[Any],
        *,
        max_active: int | None = None,
        order_outputs: bool = True,
        return_exceptions: bool = False,
    ) -> None:
        texts = [_encode_input(value) for value in inputs]
        # Keys sort in input order (t00 ... t11), and the group's name leaves room for them in
        # the runs' names (<group>-<key>, a DNS label too).
        width = len(str(max(len(texts) - 1, 0)))
        keys = [f"t{index:0{width}d}" for index in range(len(texts))]
        key_length = len(keys[-1]) if keys else 0
        self.group_name = _run_name(agent.name, f"map-{_secrets.token_hex(4)}", limit=63 - 1 - key_length)
        # Refuse a bad limit or an oversized input now, not after a group exists.
        _group_manifest(self.group_name, agent.name, max_active=max_active)
        for key, text in zip(keys, texts, strict=True):
            try:
                parse_resource(_member_manifest(self.group_name, agent.name, key, text, []))
            except Invalid as exc:
                index = int(key[1:])
                raise type(exc)(
                    f"inputs[{index}]: {exc.message}", code=exc.code, details={**exc.details, "index": index}
                ) from None
        self._answers = _map_answers(
            agent, self.group_name, keys, texts, max_active, order_outputs, return_exceptions
        )

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Any:
        return next(self._answers)

    def close(self) -> None:
        """Stop early: delete the group (its unfinished runs are cancelled)."""
        self._answers.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        item = await asyncio.to_thread(next, self._answers, _DONE)
        if item is _DONE:
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AgentMap(group={self.group_name!r})"
