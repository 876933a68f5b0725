"""WebhookService over real local storage and a real HTTP receiver: refusals that change nothing,
a run's end and wait delivered signed, a 500 retried on the schedule with every attempt recorded,
a pending delivery resumed by a restarted control plane, and deletion stopping deliveries."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from nodus.errors import Conflict, Invalid, NotFound
from nodus_ray.webhooks.records import DeliveryRecords
from tests.fakes.webhook_receiver import WebhookReceiver, running_receiver, verify
from tests.unit.test_control_support import Plane, agent_doc, group_doc, make_plane, run_doc, until

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def hook_doc(name: str, url: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Webhook",
        "metadata": {"name": name},
        "spec": {"url": url, "secretRef": {"name": "hook-key", "key": "signingSecret"}, **spec},
    }


async def _plane(tmp_path: Path, schedule: str = "0.05s,0.1s,0.2s", private: str = "127.0.0.1/32") -> Plane:
    plane = await make_plane(tmp_path, webhook_allow_private=private, webhook_retry_schedule=schedule)
    secret = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Secret",
        "metadata": {"name": "hook-key"},
        "stringData": {"signingSecret": SECRET, "plain": "not-a-whsec"},
    }
    await plane.services.secrets.apply_secret("demo", secret)
    await plane.services.agents.apply_agent("demo", agent_doc())
    return plane


def test_bad_webhooks_are_refused_naming_the_field_and_nothing_is_stored(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await _plane(tmp_path)
        hooks = plane.services.webhooks
        cases = [
            (hook_doc("h", "http://10.0.0.5/x"), "spec.url", "10.0.0.5, which is not a public address"),
            (hook_doc("h", "http://169.254.169.254/"), "spec.url", "not a public address"),
            (hook_doc("h", "gopher://127.0.0.1/"), "spec.url", r"not an http\(s\) URL"),
            (hook_doc("h", "http://127.0.0.1/", events=["run.done"]), "spec.events[0]", "Input should be"),
            (
                hook_doc("h", "http://127.0.0.1/", secretRef={"name": "nope", "key": "k"}),
                "spec.secretRef.name",
                "Secret 'nope' not found",
            ),
            (
                hook_doc("h", "http://127.0.0.1/", secretRef={"name": "hook-key", "key": "other"}),
                "spec.secretRef.key",
                "has no key 'other'",
            ),
            (
                hook_doc("h", "http://127.0.0.1/", secretRef={"name": "hook-key", "key": "plain"}),
                "spec.secretRef",
                "must start with 'whsec_'",
            ),
        ]
        for document, field, says in cases:
            with pytest.raises(Invalid, match=says) as refused:
                await hooks.apply_webhook("demo", document)
            assert refused.value.details["field"] == field
            assert "not-a-whsec" not in refused.value.message and SECRET not in refused.value.message
        assert await hooks.list_webhooks("demo") == []
        assert not plane.storage.exists("projects/demo/webhooks/h/webhook.json")
        created = await hooks.apply_webhook("demo", hook_doc("h", "http://127.0.0.1:9/x"), "create")
        assert created["result"] == "created" and created["resource"]["status"]["pending"] == 0
        with pytest.raises(Conflict):
            await hooks.apply_webhook("demo", hook_doc("h", "http://127.0.0.1:9/x"), "create")
        again = await hooks.apply_webhook("demo", hook_doc("h", "http://127.0.0.1:9/x"))
        assert again["result"] == "unchanged"
        patched = await hooks.patch_webhook("demo", "h", {"spec": {"events": ["run.failed"]}})
        assert patched["result"] == "configured" and patched["resource"]["metadata"]["generation"] == 2
        with pytest.raises(NotFound):
            await hooks.list_deliveries("demo", "missing")

    asyncio.run(scenario())


async def _deliveries(plane: Plane, name: str = "h") -> list[dict[str, Any]]:
    return await plane.services.webhooks.list_deliveries("demo", name)


def test_a_run_end_is_delivered_signed_after_a_500_and_every_attempt_is_recorded(tmp_path: Path) -> None:
    async def scenario(receiver: WebhookReceiver) -> None:
        plane = await _plane(tmp_path)
        await plane.services.webhooks.apply_webhook("demo", hook_doc("h", receiver.url + "/in"))
        receiver.script(500)
        await plane.services.runs.create_run("demo", run_doc("r1"))
        (actor,) = await until(lambda: plane.run_actors.of("r1"), what="the run's actor")
        actor.end({"phase": "Succeeded", "reason": "Completed"})
        delivered = await until(lambda: _delivered(plane), what="the delivery recorded as Delivered")
        assert [a["statusCode"] for a in delivered["attempts"]] == [500, 200]
        assert [a["attempt"] for a in delivered["attempts"]] == [1, 2]
        assert delivered["attempts"][0]["error"] == "HTTP 500" and delivered["attempts"][1]["error"] is None
        assert delivered["payload"]["data"]["name"] == "r1" and delivered["eventType"] == "run.succeeded"
        arrived = receiver.of_type("run.succeeded", "r1")
        assert [r.status for r in arrived] == [500, 200] and all(verify(SECRET, r) for r in arrived)
        assert {r.headers["webhook-id"] for r in arrived} == {delivered["eventId"]}
        assert arrived[0].path == "/in" and arrived[0].body == arrived[1].body
        status = (await plane.services.webhooks.get_webhook("demo", "h"))["status"]
        assert status["delivered"] == 1 and status["consecutiveFailures"] == 0 and status["lastSuccessAt"]
        assert status["lastError"] == "HTTP 500"
        (stored,) = plane.storage.list_dir("projects/demo/webhooks/h/deliveries")
        assert (
            SECRET not in plane.storage.read_bytes(f"projects/demo/webhooks/h/deliveries/{stored}").decode()
        )
        assert len(receiver.received) == 2  # Pending and Running were no events
        await plane.services.webhooks.close()

    with running_receiver() as receiver:
        asyncio.run(scenario(receiver))


async def _delivered(plane: Plane, state: str = "Delivered") -> dict[str, Any] | None:
    items = await plane.services.webhooks.list_deliveries("demo", "h")
    return items[0] if items and items[0]["state"] == state else None


def test_waits_and_group_filters_and_a_receiver_that_never_answers_2xx(tmp_path: Path) -> None:
    async def scenario(receiver: WebhookReceiver) -> None:
        plane = await _plane(tmp_path)
        hooks = plane.services.webhooks
        await hooks.apply_webhook("demo", hook_doc("h", receiver.url, events=["run.waiting", "run.failed"]))
        await hooks.apply_webhook("demo", hook_doc("only-g", receiver.url + "/g", group="g"))
        await plane.services.runs.create_run("demo", run_doc("r1"))
        await until(lambda: plane.phase("r1") == "Running", what="the run to start")
        waiting = {"phase": "Waiting", "reason": "AwaitingMessage", "message": "answered"}
        await plane.services.runs.report("demo", "r1", waiting)
        await plane.services.runs.report("demo", "r1", {"cost": {"totalUSD": "0.02"}})  # no event
        arrived = await until(lambda: receiver.of_type("run.waiting", "r1"), what="the wait's event")
        assert arrived[0].event["data"]["reason"] == "AwaitingMessage" and arrived[0].path == "/"
        receiver.script(500, 503, 502, 500)
        await plane.services.runs.cancel_run("demo", "r1")  # run.cancelled: not subscribed
        await plane.services.runs.create_run("demo", run_doc("r2"))
        (actor,) = await until(lambda: plane.run_actors.of("r2"), what="r2's actor")
        actor.end({"phase": "Failed", "reason": "ModelError", "message": "boom"})
        failed = await until(lambda: _delivered(plane, "Failed"), what="the delivery to give up")
        assert [a["statusCode"] for a in failed["attempts"]] == [500, 503, 502, 500]  # 1 + 3 retries
        assert failed["nextAttemptAt"] is None and failed["eventType"] == "run.failed"
        status = (await hooks.get_webhook("demo", "h"))["status"]
        assert (
            status["failed"] == 1 and status["consecutiveFailures"] == 4 and status["lastError"] == "HTTP 500"
        )
        assert receiver.of_type("run.cancelled") == [] and not [
            r for r in receiver.received if r.path == "/g"
        ]
        assert await hooks.list_deliveries("demo", "only-g") == []
        await hooks.close()

    with running_receiver() as receiver:
        asyncio.run(scenario(receiver))


def test_a_restarted_control_plane_sends_what_was_pending_and_a_deleted_webhook_nothing(
    tmp_path: Path,
) -> None:
    async def scenario(receiver: WebhookReceiver) -> None:
        plane = await _plane(tmp_path, schedule="1s,0.05s")
        await plane.services.webhooks.apply_webhook("demo", hook_doc("h", receiver.url))
        receiver.script(500)
        await plane.services.runs.create_run("demo", run_doc("r1"))
        (actor,) = await until(lambda: plane.run_actors.of("r1"), what="the run's actor")
        actor.end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: _failed_once(plane), what="a first attempt that failed")
        await plane.services.webhooks.close()  # the old control plane is gone, its timers too
        restarted = await plane.restart()
        delivered = await until(lambda: _delivered(restarted), what="the restarted plane's delivery")
        assert [a["statusCode"] for a in delivered["attempts"]] == [500, 200]
        assert len({r.headers["webhook-id"] for r in receiver.of_type("run.succeeded")}) == 1

        hooks = restarted.services.webhooks
        receiver.script(500, 500, 500)
        await hooks.send_test("demo", "h")
        await until(lambda: len(receiver.of_type("webhook.test")) >= 1, what="the test event's first try")
        await hooks.delete_webhook("demo", "h")
        assert not restarted.storage.exists("projects/demo/webhooks/h/webhook.json")
        assert restarted.storage.list_dir("projects/demo/webhooks") == []
        seen = len(receiver.received)
        await restarted.services.runs.create_run("demo", run_doc("r3"))
        await restarted.services.runs.cancel_run("demo", "r3")
        with pytest.raises(NotFound):
            await hooks.get_webhook("demo", "h")
        assert len(receiver.received) == seen
        await hooks.close()

    with running_receiver() as receiver:
        asyncio.run(scenario(receiver))


def _failed_once(plane: Plane) -> bool:
    """A first attempt recorded in storage (what a restarted control plane reads back)."""
    records = DeliveryRecords(plane.storage).load("demo", "h")
    return bool(records and records[0].attempts)


def test_a_group_end_goes_to_the_groups_webhook_once(tmp_path: Path) -> None:
    async def scenario(receiver: WebhookReceiver) -> None:
        plane = await _plane(tmp_path)
        hooks, link = plane.services.webhooks, plane.services.group_link
        await hooks.apply_webhook(
            "demo", hook_doc("h", receiver.url + "/g", group="g", events=["group.failed"])
        )
        await hooks.apply_webhook("demo", hook_doc("other", receiver.url + "/o", group="other"))
        await plane.services.groups.apply_group("demo", group_doc("g"))
        await link.group_status("demo", "g", {"phase": "Running", "counts": {"failed": 1}}, {})
        await link.group_status("demo", "g", {"phase": "Failed", "reason": "RunsFailed"}, {})
        await link.group_status("demo", "g", {"phase": "Failed"}, {})  # a late push: no second event
        (arrived,) = await until(lambda: receiver.of_type("group.failed", "g"), what="the group's end")
        assert arrived.path == "/g" and verify(SECRET, arrived)
        data = arrived.event["data"]
        assert (data["kind"], data["phase"], data["reason"]) == ("AgentGroup", "Failed", "RunsFailed")
        assert data["finishedAt"] and data["counts"]["failed"] == 1
        await until(lambda: _delivered(plane), what="the delivery recorded")
        assert len(receiver.received) == 1 and await hooks.list_deliveries("demo", "other") == []
        await hooks.close()

    with running_receiver() as receiver:
        asyncio.run(scenario(receiver))


def test_an_end_written_without_its_record_is_recorded_and_sent_by_the_restarted_plane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window "recorded before sent" leaves: the run's end is in storage, the control plane
    dies before the event's task writes its record. Recovery owes that end (once), and never an
    end from before the Webhook, or from while it was paused."""

    async def scenario(receiver: WebhookReceiver) -> None:
        plane = await _plane(tmp_path)
        hooks = plane.services.webhooks
        await plane.services.runs.create_run("demo", run_doc("before"))
        await plane.services.runs.cancel_run("demo", "before")  # ended before the Webhook existed
        await hooks.apply_webhook("demo", hook_doc("h", receiver.url))
        await plane.services.runs.create_run("demo", run_doc("paused"))
        await hooks.patch_webhook("demo", "h", {"spec": {"paused": True}})
        await plane.services.runs.cancel_run("demo", "paused")  # no event: the Webhook is paused
        await hooks.patch_webhook("demo", "h", {"spec": {"paused": False}})
        since = (await hooks.get_webhook("demo", "h"))["status"]["subscribedSince"]
        # The control plane dies between the run's write and the record's: nothing is recorded.
        monkeypatch.setattr(hooks, "_dispatch", lambda event: None)
        await plane.services.runs.create_run("demo", run_doc("lost"))
        (actor,) = await until(lambda: plane.run_actors.of("lost"), what="the run's actor")
        actor.end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.stored_phase("lost") == "Succeeded", what="the run's end in storage")
        assert DeliveryRecords(plane.storage).load("demo", "h") == []
        await hooks.close()

        restarted = await plane.restart()
        delivered = await until(lambda: _delivered(restarted), what="the owed end's delivery")
        assert delivered["eventType"] == "run.succeeded" and delivered["payload"]["data"]["name"] == "lost"
        (arrived,) = receiver.of_type("run.succeeded", "lost")
        assert verify(SECRET, arrived) and arrived.headers["webhook-id"] == delivered["eventId"]
        assert receiver.of_type("run.cancelled") == []
        status = (await restarted.services.webhooks.get_webhook("demo", "h"))["status"]
        assert status["subscribedSince"] == since and status["delivered"] == 1
        stored = DeliveryRecords(restarted.storage)
        await until(
            lambda: [r.state for r in stored.load("demo", "h")] == ["Delivered"],
            what="the delivery's outcome in storage (a record still Pending there is sent again)",
        )
        await restarted.services.webhooks.close()

        again = await plane.restart()  # recorded now: a second restart owes nothing
        await until(lambda: _delivered(again), what="the recorded delivery, reloaded")
        assert len(DeliveryRecords(again.storage).load("demo", "h")) == 1
        assert len(receiver.received) == 1
        await again.services.webhooks.close()

    with running_receiver() as receiver:
        asyncio.run(scenario(receiver))
