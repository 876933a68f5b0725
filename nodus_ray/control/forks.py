"""Forking a run: a new AgentRun that starts from a step of another one (decision 58).

``POST .../agentruns/{name}/fork``, ``AgentRun.fork`` and ``nodus agentrun fork`` end here.
Where the fork starts and what it keeps is `fork_point`'s pure decision; this service reads the
original, refuses what it cannot honour, and fills the fork's storage before the fork is stored
and started (`RunService.create_prepared`), so its first actor finds, as a replacement actor
would after a crash:

- its journal: the original's records before the boundary, copied (never shared: the original
  stays as it was and can be deleted), as one chunk ``{first}-{last}.arrow``, with their billed
  figures zero (`fork_point.free_of_charge`);
- its workspace: the stored state that journal describes (the snapshot after the prefix's last
  command, `snapshots.accepted_states`; for a Python program the newest one taken before the
  boundary), its manifest and blobs copied, and the evaluation seed when the original had one;
- its inbox: the original's messages (all of them, so the fork reads the same inputs), or with
  ``--input`` those the prefix read and then the new input (the conversation branches there);
- ``status.forkedFrom``: the run, its uid, the step, its number and the boundary's seq.

The fork is a new run of the Agent revision the original pinned (its ``agent.json``), with the
original's spec (``input`` replaced by a new prompt) minus what would tie it to something else:
its group, task key, dependencies and session key. It runs as a replay does: every copied step
returns its recorded result, and it goes on from the boundary.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from nodus.contract import API_VERSION, MAX_INPUT_BYTES
from nodus.errors import Conflict, Invalid
from nodus.resources import AgentRun, parse_resource
from nodus.schema_common import validate_dns_label
from nodus_ray.control.fork_point import ForkPoint, fork_point
from nodus_ray.control.generations import generation_of, run_journal
from nodus_ray.control.registry import Key, Registry, check_project, is_python
from nodus_ray.control.retention_policy import check_payloads
from nodus_ray.control.runs import RunService
from nodus_ray.durable.journal import encode_segment
from nodus_ray.runtime.interrupted import command_attempts
from nodus_ray.sandbox.snapshots import NO_COMMAND, accepted_states
from nodus_ray.sandbox.workspace_manifest import TRANSFERS, Manifest
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage
from nodus_ray.store.timestamps import utc_now

__all__ = ["ForkRequest", "ForkService", "stored_states", "fork_name"]

_DROPPED_SPEC = ("group", "taskKey", "dependsOn", "sessionKey")


@dataclass(frozen=True)
class ForkRequest:
    """What the API's body says: the step, the new run's name (None: chosen), a new input."""

    at: str
    name: str | None = None
    input: str | None = None


def stored_states(storage: Storage, prefix: str) -> dict[int, str]:
    """The workspace states stored under a run's ``prefix``, by seq: "manifest" or "tar"."""
    stored: dict[int, str] = {}
    for entry in storage.list_dir(layout.workspace_folder(prefix)):
        number, _, rest = entry.partition(".")
        if number.isdigit() and rest in ("manifest.json", "tar.gz"):
            if rest == "manifest.json" or int(number) not in stored:
                stored[int(number)] = "manifest" if rest == "manifest.json" else "tar"
    return stored


def fork_name(original: str, taken: set[str]) -> str:
    """``<original>-fork-<n>``, the first n not taken (the original cut to fit 63 characters)."""
    number = 1
    while True:
        suffix = f"-fork-{number}"
        name = original[: 63 - len(suffix)].rstrip("-") + suffix
        if name not in taken:
            return name
        number += 1


def _copy_state(storage: Storage, source: str, target: str, seq: int, form: str) -> None:
    """The workspace state ``seq`` of the run at ``source``, stored for the run at ``target``:
    its blobs first, its manifest last (a manifest is there only with everything it names)."""
    if form == "tar":
        data = storage.read_bytes(layout.workspace_snapshot(source, seq))
        storage.write_bytes(layout.workspace_snapshot(target, seq), data)
        return
    document = storage.read_json(layout.workspace_manifest(source, seq))

    def copy(digest: str) -> None:
        data = storage.read_bytes(layout.workspace_blob(source, digest))
        storage.write_bytes(layout.workspace_blob(target, digest), data)

    with ThreadPoolExecutor(max_workers=TRANSFERS) as pool:
        list(pool.map(copy, sorted(Manifest.from_json(document).digests())))
    storage.write_json(layout.workspace_manifest(target, seq), document)


class ForkService:
    """``fork``: a new run from a step of another (see the module)."""

    def __init__(self, registry: Registry, runs: RunService) -> None:
        self._registry = registry
        self._runs = runs

    async def fork(self, project: str, name: str, request: ForkRequest) -> dict[str, Any]:
        """Create the fork and start it; returns the new run's resource."""
        check_project(project)
        original = self._registry.run(project, name)  # NotFound: no such run in this project
        new_name = self._new_name(project, name, request.name)
        if request.input is not None:
            _check_input(request.input)
        status = original["status"]
        if generation_of(status) > 0:
            raise Invalid(
                f"agentrun {name!r} continued as new (generation {generation_of(status)}): only a "
                "run's first generation can be forked",
                details={"field": "at", "generation": generation_of(status)},
            )
        check_payloads(original, "journal")  # a skeleton cannot be replayed
        storage = self._registry.storage
        key = (project, name)
        records = await asyncio.to_thread(run_journal(storage, key, status).load)
        program = is_python(original)
        point = fork_point(
            records,
            request.at,
            has_input=request.input is not None,
            program=program,
            keep_alive=bool(original["spec"].get("keepAlive")),
        )
        state = await asyncio.to_thread(self._workspace_state, original, point, program)
        agent = await asyncio.to_thread(storage.read_json, layout.run_agent(*key))
        spec = {k: v for k, v in original["spec"].items() if k not in _DROPPED_SPEC}
        if point.replaces == "prompt":
            spec["input"] = request.input
        metadata: dict[str, Any] = {"name": new_name}
        if original["metadata"].get("labels"):
            metadata["labels"] = original["metadata"]["labels"]
        document = {"apiVersion": API_VERSION, "kind": "AgentRun", "metadata": metadata, "spec": spec}
        run = parse_resource(document, expected_kind="AgentRun")
        assert isinstance(run, AgentRun)

        def prepare(target: Key, resource: dict[str, Any]) -> None:
            try:
                self._fill(key, original, target, resource, point, state, request.input)
            except BaseException:
                storage.delete_tree(layout.run_prefix(*target))  # nothing of a fork that failed
                raise

        (created,) = await self._runs.create_prepared(project, run, agent, prepare)
        return dict(created["resource"])

    def _new_name(self, project: str, name: str, requested: str | None) -> str:
        if requested is None or requested == "":
            taken = {run for (p, run) in self._registry.runs if p == project}
            return fork_name(name, taken)
        try:
            return validate_dns_label(requested)
        except ValueError as exc:
            raise Invalid(f"name: {exc}", details={"field": "name"}) from None

    def _workspace_state(
        self, original: dict[str, Any], point: ForkPoint, program: bool
    ) -> tuple[int, str] | None:
        """The stored workspace state the fork starts from (seq, form), None for a new one.

        `Conflict` (``WorkspaceNotStored``, ``WorkspaceDeleted``) when the prefix ran commands
        whose state is no longer stored: a fork would replay their results on files that are gone.
        """
        project, name = original["metadata"]["project"], original["metadata"]["name"]
        stored = stored_states(self._registry.storage, layout.run_prefix(project, name))
        if program:
            before = [seq for seq in stored if seq < point.boundary_seq]
            return (max(before), stored[max(before)]) if before else None
        accepted = accepted_states(command_attempts(list(point.records)))
        if not accepted:
            return None
        for seq in accepted:
            if seq == NO_COMMAND:
                return None
            if seq in stored:
                return seq, stored[seq]
        deleted = (original["status"].get("sandbox") or {}).get("workspaceDeletedAt")
        if deleted:
            raise Conflict(
                f"agentrun {name!r} cannot be forked at step {point.number} ({point.step}): its "
                f"workspace was deleted at {deleted} (NODUS_WORKSPACE_RETENTION after it finished)",
                code="WorkspaceDeleted",
                details={"kind": "AgentRun", "name": name, "field": "status.sandbox.workspaceDeletedAt"},
            )
        raise Conflict(
            f"agentrun {name!r} cannot be forked at step {point.number} ({point.step}): the workspace "
            f"after its command at journal seq {accepted[0]} is not stored (snapshots were off, the "
            "workspace was over the snapshot limit, or the run predates kept snapshot history)",
            code="WorkspaceNotStored",
            details={"kind": "AgentRun", "name": name, "field": "at", "seq": accepted[0]},
        )

    def _fill(
        self,
        source: Key,
        original: dict[str, Any],
        target: Key,
        resource: dict[str, Any],
        point: ForkPoint,
        state: tuple[int, str] | None,
        new_input: str | None,
    ) -> None:
        """Write the fork's journal, workspace, seed and inbox; add ``forkedFrom`` to its status."""
        storage = self._registry.storage
        source_prefix, target_prefix = layout.run_prefix(*source), layout.run_prefix(*target)
        if point.records:
            first, last = point.records[0].seq, point.records[-1].seq
            folder = layout.journal_generation_folder(*target, 0)
            storage.create_bytes(
                layout.journal_chunk(folder, first, last), encode_segment(list(point.records))
            )
        if state is not None:
            try:
                _copy_state(storage, source_prefix, target_prefix, *state)
            except FileNotFoundError:  # dropped meanwhile: an undo of the original's next command
                raise Conflict(
                    f"agentrun {source[1]!r} cannot be forked at step {point.number} ({point.step}): "
                    f"its workspace state at journal seq {state[0]} went while it was copied",
                    code="WorkspaceNotStored",
                    details={"kind": "AgentRun", "name": source[1], "field": "at", "seq": state[0]},
                ) from None
        status = resource["status"]
        if original["status"].get("workspaceSeeded") and storage.exists(layout.seed(source_prefix)):
            storage.write_bytes(layout.seed(target_prefix), storage.read_bytes(layout.seed(source_prefix)))
            status["workspaceSeeded"] = True
        received = self._copy_messages(source, target, point, new_input)
        if received:
            status["messages"] = {**(status.get("messages") or {}), "received": received}
        status["forkedFrom"] = {
            "run": source[1],
            "uid": original["metadata"].get("uid"),
            "step": point.step,
            "stepNumber": point.number,
            "seq": point.boundary_seq,
            **({"input": point.replaces} if point.replaces else {}),
        }

    def _copy_messages(self, source: Key, target: Key, point: ForkPoint, new_input: str | None) -> int:
        """The fork's inbox (see the module); returns its last message's seq (0: none)."""
        storage = self._registry.storage
        folder = layout.messages_folder(*source)
        last = 0
        for entry in storage.list_dir(folder):
            message = storage.read_json(f"{folder}/{entry}")
            seq = int(message.get("seq") or 0)
            if new_input is not None and seq > point.read_seq:
                continue  # the conversation branches at the new input: later messages answered the original
            storage.write_json(layout.message(*target, seq), message)
            last = max(last, seq)
        if point.replaces == "message":
            seq = point.read_seq + 1
            message = {"seq": seq, "name": "message", "payload": new_input, "messageKey": None}
            storage.write_json(layout.message(*target, seq), {**message, "receivedAt": utc_now()})
            last = seq
        return last


def _check_input(text: Any) -> None:
    if not isinstance(text, str):
        raise Invalid("input: must be a string (the new prompt or message)", details={"field": "input"})
    if len(text.encode("utf-8")) > MAX_INPUT_BYTES:
        raise Invalid(
            f"input: is larger than {MAX_INPUT_BYTES} bytes (256 KiB)",
            details={"field": "input", "limit": MAX_INPUT_BYTES},
        )
