"""`AgentMap`, what `Agent.map` returns: one run per input in an ephemeral AgentGroup, each
run's answer as it finishes (or in input order), and the group deleted at the end.

Iterate with ``for`` or ``async for``; closing the iterator early cancels what still runs.
"""

from __future__ import annotations

import asyncio
import secrets as _secrets
import sys
import time
import warnings
from collections.abc import Generator, Iterable, Iterator, Mapping
from typing import Any, Self

from .agent import Agent
from .errors import AgentRunFailed, Conflict, Invalid, NotFound, Unavailable
from .group import AgentGroup, _group_manifest, _member_manifest
from .handles import (
    _POLL_FIRST_DELAY,
    _POLL_MAX_DELAY,
    _UNAVAILABLE_GRACE,
    _encode_input,
    _run_failed,
    _run_name,
)
from .resources import TERMINAL_PHASES, at_cost_cap, member_run_name, parse_resource

__all__ = ["AgentMap"]


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
                if not isinstance(name, str):
                    continue
                key = key_of.get(name)
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
    labels: dict[str, str],
) -> Generator[Any, None, None]:
    # A plain function, not a method of AgentMap: the generator must not reference its owner, so
    # dropping the AgentMap (a `break`) finalizes the generator at once and its `finally` deletes
    # the group then, not at some later garbage collection.
    if not keys:
        return
    group = AgentGroup.create(group_name, agent, max_active=max_active)
    progress: _Progress | None = None
    try:
        tasks = [{"key": key, "input": text, "labels": labels} for key, text in zip(keys, texts, strict=True)]
        group.submit_many(tasks)
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
        labels: Mapping[str, str] | None = None,
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
                parse_resource(_member_manifest(self.group_name, agent.name, key, text, [], labels=labels))
            except Invalid as exc:
                index = int(key[1:])
                raise type(exc)(
                    f"inputs[{index}]: {exc.message}", code=exc.code, details={**exc.details, "index": index}
                ) from None
        self._answers = _map_answers(
            agent,
            self.group_name,
            keys,
            texts,
            max_active,
            order_outputs,
            return_exceptions,
            dict(labels or {}),
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
