"""Webhooks in the control plane: the resources, the events, and their delivery (decision 62).

The control plane is the one place that sees every run's and group's change (the registry's
``run_changed`` and ``group_changed`` signals), so it decides what is an event
(`webhooks.events`), writes one delivery record per subscribed Webhook before anything is sent
(`webhooks.records`), and sends it from background tasks: at-least-once, each attempt recorded,
retried on the operator's schedule (`webhooks.retry`), at most `_MAX_CONCURRENT` at a time with
a timeout each, so no API call or run report ever waits on a receiver. A restarted control plane
reloads the records that are still pending and goes on where their schedule was.

Nothing here holds the signing secret longer than one attempt: it is read from the Webhook's
Secret (sealed at rest) when a request is signed, and a rotated Secret signs the next attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from nodus.errors import Conflict, Invalid, NotFound
from nodus.resources import parse_resource
from nodus.schema_common import ObjectMeta
from nodus.schema_webhook import Webhook
from nodus_ray.control.registry import Key, Registry, check_project
from nodus_ray.control.secrets import SecretStore
from nodus_ray.core.patch import patched_document
from nodus_ray.settings import ServerSettings
from nodus_ray.store import layout
from nodus_ray.store.timestamps import format_timestamp, parse_timestamp, utc_now
from nodus_ray.webhooks.addresses import PrivateAccess, UnsafeDestination, resolve_destination
from nodus_ray.webhooks.catch_up import missed_end_events, subscribed_since
from nodus_ray.webhooks.events import (
    Event,
    RunState,
    group_event,
    run_event,
    run_state,
    subscribed,
    test_event,
)
from nodus_ray.webhooks.records import KEPT_FINISHED, Attempt, DeliveryRecord, DeliveryRecords, DeliveryState
from nodus_ray.webhooks.retry import RetrySchedule
from nodus_ray.webhooks.sender import AttemptResult, send
from nodus_ray.webhooks.signing import secret_key, signature_headers

__all__ = ["WebhookService", "MAX_DELIVERIES_LISTED"]

logger = logging.getLogger(__name__)

_MAX_CONCURRENT = 8  # attempts in flight at once, over every Webhook
_TIMEOUT = httpx.Timeout(10.0, connect=5.0)  # one attempt, whatever the receiver does
MAX_DELIVERIES_LISTED = 200
DeliveryKey = tuple[str, str, str]  # (project, webhook, delivery id)


class WebhookService:
    """A project's Webhooks, the events they are owed, and the tasks that deliver them."""

    def __init__(self, registry: Registry, secrets: SecretStore, settings: ServerSettings) -> None:
        self._registry = registry
        self._secrets = secrets
        self._records = DeliveryRecords(registry.storage)
        self._access = PrivateAccess.parse(settings.webhook_allow_private)
        self.schedule = RetrySchedule.parse(settings.webhook_retry_schedule)
        self._webhooks: dict[Key, dict[str, Any]] = {}
        # Every kept record of each Webhook, oldest first (bounded: `KEPT_FINISHED` finished).
        self._deliveries: dict[Key, dict[str, DeliveryRecord]] = {}
        self._timers: dict[DeliveryKey, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Each run's uid and the (phase, reason) last seen: a run deleted and created again under
        # its name starts afresh.
        self._run_states: dict[Key, tuple[str, RunState]] = {}
        self._semaphore: asyncio.Semaphore | None = None
        self._client: httpx.AsyncClient | None = None
        registry.on_run_changed(self._run_changed)
        registry.on_group_changed(self._group_changed)

    # -- recovery ---------------------------------------------------------------------------

    async def recover(self) -> None:
        """The Webhooks and their records from storage; every pending record scheduled again
        (at once if its time passed while the service was down). Runs' states are noted so only
        changes after this are events."""
        await asyncio.to_thread(self._load)
        self._run_states = {key: (_uid(run), run_state(run)) for key, run in self._registry.runs.items()}
        for records in self._deliveries.values():
            for record in records.values():
                if record.state == DeliveryState.PENDING:
                    self._schedule(record, _seconds_until(record.nextAttemptAt))
        self._catch_up()

    def _catch_up(self) -> None:
        """Record the ends a control plane that died wrote without their delivery records
        (`webhooks.catch_up`): the one window "recorded before sent" leaves open."""
        if not self._webhooks:
            return
        runs: dict[str, list[dict[str, Any]]] = {}
        groups: dict[str, list[dict[str, Any]]] = {}
        for (project, _), run in self._registry.runs.items():
            runs.setdefault(project, []).append(run)
        for (project, _), group in self._registry.groups.items():
            groups.setdefault(project, []).append(group)
        for key, webhook in list(self._webhooks.items()):
            project = key[0]
            records = self._deliveries.get(key, {}).values()
            owed = missed_end_events(
                project, webhook, records, runs.get(project, []), groups.get(project, [])
            )
            for event in owed:
                logger.info(
                    "webhook %s/%s: %s of %s was not recorded; recorded now", *key, event.type, event.id
                )
                self._background(self._record(key, event))

    def _load(self) -> None:
        storage = self._registry.storage
        for project in storage.list_dir(layout.projects_folder()):
            for name in storage.list_dir(layout.webhooks_folder(project)):
                try:
                    document = storage.read_json(layout.webhook_document(project, name))
                except (FileNotFoundError, ValueError):
                    logger.warning("webhook %s/%s could not be read; skipped", project, name)
                    continue
                self._webhooks[(project, name)] = document
                records = self._records.load(project, name)
                self._deliveries[(project, name)] = {record.id: record for record in records}

    async def close(self) -> None:
        """No more attempts from this service (its timers cancelled, its HTTP client closed);
        what is pending stays recorded for the next control plane."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- the resource -----------------------------------------------------------------------

    def _view(self, key: Key) -> dict[str, Any]:
        stored = self._webhooks[key]
        return {**stored, "status": {"subscribedSince": subscribed_since(stored), **self._status(key)}}

    def _status(self, key: Key) -> dict[str, Any]:
        records = list(self._deliveries.get(key, {}).values())
        attempts = sorted((a for r in records for a in r.attempts), key=lambda a: a.at)
        successes = [a for a in attempts if a.error is None]
        failures = [a for a in attempts if a.error is not None]
        consecutive = 0
        for attempt in reversed(attempts):
            if attempt.error is None:
                break
            consecutive += 1
        return {
            "lastSuccessAt": successes[-1].at if successes else None,
            "lastFailureAt": failures[-1].at if failures else None,
            "lastError": failures[-1].error if failures else None,
            "consecutiveFailures": consecutive,
            "pending": sum(r.state == DeliveryState.PENDING for r in records),
            "delivered": sum(r.state == DeliveryState.DELIVERED for r in records),
            "failed": sum(r.state == DeliveryState.FAILED for r in records),
        }

    def _stored(self, project: str, name: str) -> dict[str, Any]:
        check_project(project)
        stored = self._webhooks.get((project, name))
        if stored is None:
            raise NotFound(
                f"webhook {name!r} not found in project {project!r}",
                details={"kind": "Webhook", "name": name},
            )
        return stored

    async def _check_secret(self, project: str, webhook: Webhook) -> None:
        """The Secret and key ``secretRef`` names exist and hold a ``whsec_`` secret."""
        ref = webhook.spec.secretRef
        field = "spec.secretRef"
        if not self._secrets.exists(project, ref.name):
            raise Invalid(
                f"Webhook {field}.name: Secret {ref.name!r} not found in project {project!r}; create it "
                f"first (a key holding a whsec_ signing secret, docs/webhooks.md)",
                details={"field": f"{field}.name", "kind": "Webhook"},
            )
        values = await asyncio.to_thread(self._secrets.values, project, ref.name)
        if ref.key not in values:
            raise Invalid(
                f"Webhook {field}.key: Secret {ref.name!r} has no key {ref.key!r}",
                details={"field": f"{field}.key", "kind": "Webhook"},
            )
        try:
            secret_key(values[ref.key])
        except ValueError as exc:
            raise Invalid(
                f"Webhook {field}: key {ref.key!r} of Secret {ref.name!r}: {exc}",
                details={"field": field, "kind": "Webhook"},
            ) from None

    async def apply_webhook(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        """Create (``mode="create"``) or create-or-update a Webhook; refused with nothing changed:
        a URL that is not http(s) or whose host is not public (unless the operator allowed it),
        an unknown event type, a missing Secret or key, a key that is not a ``whsec_`` secret."""
        check_project(project)
        webhook = parse_resource(document, expected_kind="Webhook")
        assert isinstance(webhook, Webhook)
        try:
            await resolve_destination(webhook.spec.url, self._access)
        except UnsafeDestination as exc:
            raise Invalid(
                f"Webhook spec.url: {exc}", details={"field": "spec.url", "kind": "Webhook"}
            ) from None
        await self._check_secret(project, webhook)
        name = webhook.metadata.name
        key = (project, name)
        async with self._registry.locks[("webhook", project, name)]:
            existing = self._webhooks.get(key)
            if existing is not None and mode == "create":
                raise Conflict(
                    f"webhook {name!r} already exists",
                    code="AlreadyExists",
                    details={"kind": "Webhook", "name": name},
                )
            spec = webhook.spec.model_dump(mode="json", exclude_none=True)
            labels = webhook.metadata.labels
            if (
                existing is not None
                and existing["spec"] == spec
                and existing["metadata"].get("labels") == labels
            ):
                return {"resource": self._view(key), "result": "unchanged"}
            resource = Webhook(
                metadata=ObjectMeta(
                    name=name,
                    project=project,
                    uid=existing["metadata"]["uid"] if existing else uuid.uuid4().hex,
                    generation=int(existing["metadata"].get("generation") or 0) + 1 if existing else 1,
                    creationTimestamp=existing["metadata"]["creationTimestamp"] if existing else utc_now(),
                    labels=labels,
                ),
                spec=webhook.spec,
            ).model_dump(mode="json", exclude_none=True)
            resource["spec"] = spec
            unchanged_spec = existing is not None and existing["spec"] == spec
            resource["status"] = {
                "subscribedSince": subscribed_since(existing) if unchanged_spec and existing else utc_now()
            }
            await asyncio.to_thread(
                self._registry.storage.write_json, layout.webhook_document(project, name), resource
            )
            self._webhooks[key] = resource
            self._deliveries.setdefault(key, {})
        return {"resource": self._view(key), "result": "created" if existing is None else "configured"}

    async def get_webhook(self, project: str, name: str) -> dict[str, Any]:
        self._stored(project, name)
        return self._view((project, name))

    async def list_webhooks(self, project: str) -> list[dict[str, Any]]:
        check_project(project)
        return [self._view(key) for key in sorted(self._webhooks) if key[0] == project]

    async def patch_webhook(self, project: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        current = self._stored(project, name)
        return await self.apply_webhook(project, patched_document(current, patch, name), mode="apply")

    async def delete_webhook(self, project: str, name: str) -> dict[str, Any]:
        """The Webhook and every record of it; its pending deliveries are not sent."""
        self._stored(project, name)
        key = (project, name)
        view = self._view(key)
        async with self._registry.locks[("webhook", project, name)]:
            for delivery in list(self._deliveries.get(key, {})):
                timer = self._timers.pop((project, name, delivery), None)
                if timer is not None:
                    timer.cancel()
            self._webhooks.pop(key, None)
            self._deliveries.pop(key, None)
            await asyncio.to_thread(self._registry.storage.delete_tree, layout.webhook_prefix(project, name))
        return view

    async def list_deliveries(self, project: str, name: str, limit: int = 50) -> list[dict[str, Any]]:
        """The Webhook's deliveries, newest first, each with every attempt."""
        self._stored(project, name)
        if not 1 <= limit <= MAX_DELIVERIES_LISTED:
            raise Invalid(
                f"limit: from 1 to {MAX_DELIVERIES_LISTED}, not {limit}", details={"field": "limit"}
            )
        records = list(self._deliveries.get((project, name), {}).values())
        return [record.view() for record in reversed(records[-limit:])]

    async def send_test(self, project: str, name: str) -> dict[str, Any]:
        """A ``webhook.test`` event to this Webhook alone, recorded and retried like any other."""
        self._stored(project, name)
        event = test_event(project, name, uuid.uuid4().hex, utc_now())
        record = await self._record((project, name), event)
        return record.view()

    # -- events -----------------------------------------------------------------------------

    def _has_webhooks(self, project: str) -> bool:
        return any(key[0] == project for key in self._webhooks)

    async def _run_changed(self, key: Key) -> None:
        """A run's phase or spend changed: an event if it reached a state worth one. Never
        raises and never waits on storage or a receiver (the caller is a run's report)."""
        try:
            run = self._registry.runs.get(key)
            if run is None:
                self._run_states.pop(key, None)
                return
            uid, state = _uid(run), run_state(run)
            seen = self._run_states.get(key)
            previous = seen[1] if seen is not None and seen[0] == uid else None
            self._run_states[key] = (uid, state)
            if state == previous or not self._has_webhooks(key[0]):
                return
            event = run_event(key[0], run, previous, utc_now())
            if event is not None:
                self._dispatch(event)
        except Exception:  # noqa: BLE001 - a webhook must never break a run's report
            logger.exception("webhooks: the change of run %s/%s was not handled", *key)

    async def _group_changed(self, key: Key) -> None:
        try:
            group = self._registry.groups.get(key)
            if group is None or not self._has_webhooks(key[0]):
                return
            event = group_event(key[0], group, utc_now())
            if event is not None:
                self._dispatch(event)
        except Exception:  # noqa: BLE001 - a webhook must never break a group's status
            logger.exception("webhooks: the change of group %s/%s was not handled", *key)

    def _dispatch(self, event: Event) -> None:
        """Record and send the event to each subscribed Webhook, in the background."""
        for key, webhook in list(self._webhooks.items()):
            if key[0] == event.project and subscribed(webhook["spec"], event):
                self._background(self._record(key, event))

    def _background(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record(self, key: Key, event: Event) -> DeliveryRecord:
        """Write the record (durable before any attempt), then its first attempt is due now."""
        record = DeliveryRecord.new(key[0], key[1], event, utc_now())
        if not await self._write(key, record):
            return record  # the Webhook was deleted meanwhile
        self._deliveries.setdefault(key, {})[record.id] = record
        self._schedule(record, 0.0)
        return record

    # -- delivery ---------------------------------------------------------------------------

    def _schedule(self, record: DeliveryRecord, delay: float) -> None:
        dkey = (record.project, record.webhook, record.id)
        old = self._timers.pop(dkey, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[dkey] = loop.call_later(max(0.0, delay), lambda: self._background(self._attempt(dkey)))

    async def _attempt(self, dkey: DeliveryKey) -> None:
        self._timers.pop(dkey, None)
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(_MAX_CONCURRENT)
        async with self._semaphore:
            key = (dkey[0], dkey[1])
            record = self._deliveries.get(key, {}).get(dkey[2])
            webhook = self._webhooks.get(key)
            if record is None or webhook is None or record.state != DeliveryState.PENDING:
                return
            number = len(record.attempts) + 1
            at = utc_now()
            try:
                result = await self._try(webhook, record)
            except Exception as exc:  # noqa: BLE001 - recorded as the attempt's failure, retried
                logger.exception("webhook %s/%s: attempt %d failed unexpectedly", *key, number)
                result = AttemptResult(None, 0, f"internal error: {type(exc).__name__}")
            record.attempts.append(Attempt(number, at, result.status_code, result.duration_ms, result.error))
            delay = None if result.ok else self.schedule.delay_after(number)
            if result.ok:
                record.state, record.nextAttemptAt = DeliveryState.DELIVERED, None
            elif delay is None:
                record.state, record.nextAttemptAt = DeliveryState.FAILED, None
            else:
                record.nextAttemptAt = format_timestamp(datetime.now(UTC) + timedelta(seconds=delay))
            if not await self._write(key, record):
                return  # deleted while the attempt was in flight: its records are gone
            if delay is not None and not result.ok:
                self._schedule(record, delay)
            else:
                await self._prune(key)

    async def _write(self, key: Key, record: DeliveryRecord) -> bool:
        """Write the record unless its Webhook is gone (under the lock its deletion takes)."""
        async with self._registry.locks[("webhook", *key)]:
            if key not in self._webhooks:
                return False
            await asyncio.to_thread(self._records.write, record)
            return True

    async def _try(self, webhook: Mapping[str, Any], record: DeliveryRecord) -> AttemptResult:
        spec = webhook["spec"]
        ref = spec["secretRef"]
        try:
            values = await asyncio.to_thread(self._secrets.values, record.project, ref["name"])
            key = secret_key(values[ref["key"]])
        except (NotFound, FileNotFoundError, KeyError, ValueError):
            missing = f"the signing secret (Secret {ref['name']!r}, key {ref['key']!r}) is gone or not whsec_"
            return AttemptResult(None, 0, missing)
        try:
            destination = await resolve_destination(spec["url"], self._access)
        except UnsafeDestination as exc:
            return AttemptResult(None, 0, f"refused: {exc}")
        body = record.body.encode("utf-8")
        headers = signature_headers(key, record.eventId, int(time.time()), body)
        if self._client is None:
            # trust_env=False: no proxy of the environment, the request goes to the address checked.
            self._client = httpx.AsyncClient(timeout=_TIMEOUT, follow_redirects=False, trust_env=False)
        return await send(self._client, spec["url"], destination, headers, body)

    async def _prune(self, key: Key) -> None:
        """Keep `KEPT_FINISHED` finished records of the Webhook; the oldest go first."""
        records = self._deliveries.get(key, {})
        finished = [r for r in records.values() if r.state != DeliveryState.PENDING]
        for record in finished[: max(0, len(finished) - KEPT_FINISHED)]:
            records.pop(record.id, None)
            await asyncio.to_thread(self._records.delete, key[0], key[1], record.id)


def _uid(resource: Mapping[str, Any]) -> str:
    return str((resource.get("metadata") or {}).get("uid") or "")


def _seconds_until(moment: str | None) -> float:
    if not moment:
        return 0.0
    try:
        return max(0.0, (parse_timestamp(moment) - datetime.now(UTC)).total_seconds())
    except ValueError:
        return 0.0
