"""Webhooks' pure parts: the Standard Webhooks signature (the specification's own test vector,
and a verifier written here from the specification's text), the retry schedule, the SSRF guard
(every address class that must be refused, a name that resolves to one, the operator's leave)
and which change of a run or group is an event."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import random
from typing import Any

import pytest

from nodus.errors import Invalid
from nodus.resources import parse_resource
from nodus_ray.webhooks.addresses import PrivateAccess, UnsafeDestination, resolve_destination
from nodus_ray.webhooks.events import group_event, run_event, run_state, subscribed
from nodus_ray.webhooks.retry import RetrySchedule
from nodus_ray.webhooks.signing import generate_secret, secret_key, sign, signature_headers


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """A receiver's check, as the Standard Webhooks specification writes it: the key is the
    base64 after ``whsec_``; the signed content is ``{webhook-id}.{webhook-timestamp}.{body}``;
    the header holds space-separated ``v1,<base64>`` signatures, any of which may match."""
    key = base64.b64decode(secret.split("_", 1)[1])
    content = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    for signature in headers["webhook-signature"].split(" "):
        version, _, value = signature.partition(",")
        if version == "v1" and hmac.compare_digest(value, expected):
            return True
    return False


def test_the_signature_is_the_specifications_test_vector() -> None:
    # The vector of the Standard Webhooks reference libraries' tests (and Svix's documentation).
    key = secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    signed = sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
    assert signed == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_headers_verify_with_an_independent_check_and_fail_on_any_change() -> None:
    secret = generate_secret()
    body = b'{"type":"run.succeeded"}'
    headers = signature_headers(secret_key(secret), "msg_1", 1700000000, body)
    assert headers["content-type"] == "application/json" and headers["webhook-id"] == "msg_1"
    assert verify(secret, headers, body)
    assert not verify(secret, headers, body + b" ")
    assert not verify(secret, {**headers, "webhook-timestamp": "1700000001"}, body)
    assert not verify(generate_secret(), headers, body)


@pytest.mark.parametrize(
    ("secret", "says"),
    [
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "must start with 'whsec_'"),
        ("whsec_not base64!", "is not base64"),
        ("whsec_" + base64.b64encode(b"short").decode(), "24 to 64 bytes, not 5"),
    ],
)
def test_a_secret_that_is_not_a_whsec_secret_is_refused_without_showing_it(secret: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as refused:
        secret_key(secret)
    assert secret not in str(refused.value)


def test_the_retry_schedule_default_custom_jitter_and_end() -> None:
    default = RetrySchedule.parse(None)
    assert default.delays == (5.0, 30.0, 120.0, 600.0, 3600.0, 10800.0, 21600.0) and default.attempts == 8
    schedule = RetrySchedule.parse("0.5s, 2s,1m")
    assert schedule.delays == (0.5, 2.0, 60.0) and RetrySchedule.parse(schedule.text()) == schedule
    rng = random.Random(7)
    for attempt, base in enumerate(schedule.delays, start=1):
        delays = [schedule.delay_after(attempt, rng) for _ in range(200)]
        assert all(d is not None and base * 0.8 <= d <= base * 1.2 for d in delays)
        assert len(set(delays)) > 100  # spread, not one value
    assert schedule.delay_after(4) is None and schedule.delay_after(0) is None


@pytest.mark.parametrize("text", ["0s", "5x", "25h", "", ",", "1s,,2s", ",".join(["1s"] * 21)])
def test_a_bad_retry_schedule_is_refused_naming_the_setting(text: str) -> None:
    if text == "":
        RetrySchedule.parse(text)  # empty: the default
        return
    with pytest.raises(ValueError, match="NODUS_WEBHOOK_RETRY_SCHEDULE"):
        RetrySchedule.parse(text)


def _resolve(url: str, access: PrivateAccess | None = None) -> Any:
    return asyncio.run(resolve_destination(url, access or PrivateAccess()))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/hook",
        "http://10.1.2.3/hook",
        "http://192.168.0.1/",
        "http://172.16.0.9/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:9000/",
        "http://[::ffff:127.0.0.1]/",
        "http://[fe80::1]/",
        "http://224.0.0.1/",
        "http://0.0.0.0/",
        "http://100.64.0.1/",
        "http://localhost:8000/",  # a name that resolves to loopback
    ],
)
def test_private_and_special_addresses_are_refused(url: str) -> None:
    with pytest.raises(UnsafeDestination, match="not a public address.*NODUS_WEBHOOK_ALLOW_PRIVATE"):
        _resolve(url)


def test_a_public_address_passes_and_the_operator_opens_private_ones() -> None:
    public = _resolve("https://93.184.215.14:8443/x")
    assert public.host == "93.184.215.14" and public.port == 8443 and public.scheme == "https"
    assert _resolve("http://127.0.0.1/", PrivateAccess.parse("1")).port == 80
    only = PrivateAccess.parse("127.0.0.3/32, 10.0.0.0/8")
    assert _resolve("http://10.9.9.9/", only).addresses[0].exploded == "10.9.9.9"
    assert _resolve("http://[::ffff:10.0.0.1]/", only).port == 80  # a mapped form of an opened one
    with pytest.raises(UnsafeDestination):
        _resolve("http://127.0.0.1/", only)
    with pytest.raises(UnsafeDestination, match="does not resolve"):
        _resolve("http://nothing.invalid/")
    with pytest.raises(ValueError, match="NODUS_WEBHOOK_ALLOW_PRIVATE: 'ten' is neither"):
        PrivateAccess.parse("ten")
    assert PrivateAccess.parse("0") == PrivateAccess()


def _doc(**spec: Any) -> dict[str, Any]:
    base = {"url": "https://hooks.example.com/x", "secretRef": {"name": "s", "key": "k"}}
    return {"apiVersion": "nodus.dev/v1", "kind": "Webhook", "metadata": {"name": "h"}, "spec": base | spec}


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        ({"url": "ftp://hooks.example.com/"}, "spec.url", r"not an http\(s\) URL"),
        ({"url": "file:///etc/passwd"}, "spec.url", r"not an http\(s\) URL"),
        ({"url": "https://user:pw@hooks.example.com/"}, "spec.url", "user or password"),
        ({"url": "hooks.example.com/x"}, "spec.url", r"not an http\(s\) URL"),
        ({"events": ["run.finished"]}, "spec.events[0]", "Input should be 'run.succeeded'"),
        ({"events": []}, "spec.events", "at least 1"),
        ({"events": ["run.failed", "run.failed"]}, "spec.events", "twice"),
        ({"secretRef": None}, "spec.secretRef", "Field required"),
        ({"group": "Not_A_Label"}, "spec.group", "DNS label"),
    ],
)
def test_bad_webhook_documents_are_refused_naming_the_field(
    spec: dict[str, Any], field: str, says: str
) -> None:
    document = _doc(**spec)
    if spec.get("secretRef", 1) is None:
        del document["spec"]["secretRef"]
    with pytest.raises(Invalid, match=says) as refused:
        parse_resource(document)
    assert refused.value.details["field"] == field


def _run(phase: str, reason: str | None = None, version: int = 3, group: str | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "r1", "uid": "u1", "resourceVersion": version},
        "spec": {"agent": "a", **({"group": group} if group else {})},
        "status": {"phase": phase, "reason": reason, "cost": {"totalUSD": "0.01"}},
    }


@pytest.mark.parametrize(
    ("phase", "reason", "expected"),
    [
        ("Succeeded", "Completed", "run.succeeded"),
        ("Failed", "ModelError", "run.failed"),
        ("Cancelled", "Cancelled", "run.cancelled"),
        ("Waiting", "NeedsResolution", "run.waiting"),
        ("Waiting", "AwaitingMessage", "run.waiting"),
        ("Waiting", "InsufficientCredits", None),  # credits, not a person
        ("Waiting", "Sleeping", None),
        ("Running", None, None),
        ("Pending", "GroupWait", None),
    ],
)
def test_which_run_state_is_an_event(phase: str, reason: str | None, expected: str | None) -> None:
    event = run_event("p", _run(phase, reason), ("Running", None), "2026-12-03T00:00:00Z")
    assert (event.type if event else None) == expected
    if event is not None:
        body = json.loads(event.body)
        assert body["type"] == expected and body["timestamp"] == "2026-12-03T00:00:00Z"
        assert (body["data"]["name"], body["data"]["uid"], body["data"]["phase"]) == ("r1", "u1", phase)
        assert body["data"]["reason"] == reason and body["data"]["cost"] == {"totalUSD": "0.01"}


def test_the_same_state_again_is_no_event_and_each_change_has_its_own_stable_id() -> None:
    waiting = _run("Waiting", "AwaitingMessage", version=4)
    assert run_event("p", waiting, run_state(waiting), "t") is None  # a cost report while waiting
    first = run_event("p", waiting, ("Running", None), "t1")
    again = run_event("p", waiting, ("Running", None), "t2")
    later = run_event("p", _run("Waiting", "AwaitingMessage", version=9), ("Running", None), "t3")
    assert first is not None and again is not None and later is not None
    assert first.id == again.id != later.id and first.id.startswith("msg_")


def test_a_group_end_is_an_event_and_subscriptions_filter_by_type_group_and_pause() -> None:
    group = {
        "metadata": {"name": "g1", "uid": "gu"},
        "spec": {"agent": "a"},
        "status": {"phase": "Failed", "counts": {"failed": 1}, "finishedAt": "2026-12-03T00:00:00Z"},
    }
    event = group_event("p", group, "t")
    assert event is not None and event.type == "group.failed" and event.group == "g1"
    assert json.loads(event.body)["data"]["counts"] == {"failed": 1}
    assert group_event("p", {**group, "status": {"phase": "Running"}}, "t") is None
    member = run_event("p", _run("Succeeded", "Completed", group="g1"), None, "t")
    loner = run_event("p", _run("Succeeded", "Completed"), None, "t")
    assert member is not None and loner is not None
    spec = {"events": ["run.succeeded", "group.failed"], "group": "g1"}
    assert subscribed(spec, event) and subscribed(spec, member) and not subscribed(spec, loner)
    assert subscribed({"events": ["run.succeeded"]}, loner)
    assert not subscribed({"events": ["run.failed"]}, loner)
    assert not subscribed({"events": ["run.succeeded"], "paused": True}, loner)


def _ended(kind: str, name: str, phase: str, finished: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": 7},
        "spec": {"agent": "a"},
        "status": {"phase": phase, "reason": "Completed", "finishedAt": finished},
    }


def test_the_ends_a_restarted_control_plane_owes_are_those_of_the_subscription_with_no_record() -> None:
    from nodus_ray.webhooks.catch_up import missed_end_events
    from nodus_ray.webhooks.records import KEPT_FINISHED, DeliveryRecord, DeliveryState

    hook = {
        "metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"events": ["run.succeeded", "run.failed", "group.succeeded"]},
        "status": {"subscribedSince": "2026-01-02T00:00:00Z"},
    }
    runs = [
        _ended("AgentRun", "before", "Succeeded", "2026-01-01T12:00:00Z"),  # before the subscription
        _ended("AgentRun", "owed", "Succeeded", "2026-01-03T00:00:00Z"),
        _ended("AgentRun", "sent", "Failed", "2026-01-03T00:00:00Z"),  # has a record
        _ended("AgentRun", "cancelled", "Cancelled", "2026-01-03T00:00:00Z"),  # not subscribed
        {**_ended("AgentRun", "running", "Running", ""), "status": {"phase": "Running"}},
    ]
    groups = [_ended("AgentGroup", "g", "Succeeded", "2026-01-04T00:00:00Z")]
    earlier = {**runs[2], "metadata": {**runs[2]["metadata"], "resourceVersion": 6}}
    sent_event = run_event("p", earlier, None, "2026-01-03T00:00:00Z")
    assert sent_event is not None
    # A later write to the run (a label) gives another event id; the record still names the end.
    sent = DeliveryRecord.new("p", "h", sent_event, "2026-01-03T00:00:01Z")
    owed = missed_end_events("p", hook, [sent], runs, groups)
    assert sorted(json.loads(e.body)["data"]["name"] for e in owed) == ["g", "owed"]
    assert missed_end_events("p", {**hook, "spec": {**hook["spec"], "paused": True}}, [], runs, groups) == []

    # With KEPT_FINISHED finished records, an end older than the oldest may have lost its record
    # to pruning: it is not owed again. Newer ends still are.
    kept = [
        DeliveryRecord.new("p", "h", sent_event, f"2026-01-03T12:00:{i % 60:02d}Z")
        for i in range(KEPT_FINISHED)
    ]
    for record in kept:
        record.state = DeliveryState.DELIVERED
    assert [json.loads(e.body)["data"]["name"] for e in missed_end_events("p", hook, kept, runs, groups)] == [
        "g"
    ]
    # A Webhook stored before `subscribedSince` existed counts from its creation.
    legacy = {"metadata": hook["metadata"], "spec": hook["spec"]}
    names = sorted(
        json.loads(e.body)["data"]["name"] for e in missed_end_events("p", legacy, [], runs, groups)
    )
    assert names == ["before", "g", "owed", "sent"]


def test_a_groups_webhook_is_owed_only_the_ends_of_that_group_and_its_runs() -> None:
    from nodus_ray.webhooks.catch_up import missed_end_events

    hook = {
        "metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"events": ["run.succeeded", "group.succeeded"], "group": "g"},
    }
    mine, other = (
        _ended("AgentRun", "mine", "Succeeded", "2026-01-02T00:00:00Z"),
        _ended("AgentRun", "other", "Succeeded", "2026-01-02T00:00:00Z"),
    )
    mine["spec"]["group"], other["spec"]["group"] = "g", "h"
    groups = [_ended("AgentGroup", "g", "Succeeded", "2026-01-03T00:00:00Z")]
    groups.append(_ended("AgentGroup", "h", "Succeeded", "2026-01-03T00:00:00Z"))
    owed = missed_end_events("p", hook, [], [mine, other], groups)
    assert sorted((e.type, json.loads(e.body)["data"]["name"]) for e in owed) == [
        ("group.succeeded", "g"),
        ("run.succeeded", "mine"),
    ]
