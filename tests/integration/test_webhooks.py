"""Webhooks against the real service: a receiver in this process (on 127.0.0.3, the one private
address the session's operator opened) gets a run's end after a 500 (retried), a keep-alive
run's wait and a group's end, each signed as Standard Webhooks specify and recorded with every
attempt; a control plane killed between two attempts still delivers; bad Webhooks are refused by
the API (4xx JSON naming the field) and the CLI (one error line); the SDK and CLI verbs work."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

import nodus
from nodus.client_webhooks import webhook_document
from nodus_ray.webhooks.records import DeliveryRecords
from tests.fakes.webhook_receiver import WebhookReceiver, running_receiver, verify

from .conftest import NODUS, Server, unique, wait_for

PROJECT = "hooks"
V1 = "nodus.dev/v1"
BASE = f"/v1/projects/{PROJECT}"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture(scope="module")
def receiver() -> Iterator[WebhookReceiver]:
    with running_receiver("127.0.0.3") as running:
        yield running


@pytest.fixture
def client(server: Server) -> nodus.Client:
    return nodus.Client(server.api_url, project=PROJECT, token=server.token)


def _setup(client: nodus.Client, agent: str) -> None:
    client.apply(
        "secrets",
        {
            "apiVersion": V1,
            "kind": "Secret",
            "metadata": {"name": "hook-key"},
            "stringData": {"signingSecret": SECRET},
        },
    )
    spec = {"system": "Answer in one sentence.", "model": {"access": "Nodus", "families": ["haiku"]}}
    client.apply("agents", {"apiVersion": V1, "kind": "Agent", "metadata": {"name": agent}, "spec": spec})


def _run(client: nodus.Client, name: str, agent: str, **spec: Any) -> None:
    document = {
        "apiVersion": V1,
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {"agent": agent, "input": "What is 2 + 2?", **spec},
    }
    client.create("agentruns", document)


def _delivered(client: nodus.Client, hook: str, event_type: str, name: str) -> dict[str, Any] | None:
    for item in client.webhook_deliveries(hook, limit=200):
        if item["eventType"] == event_type and item["payload"]["data"]["name"] == name:
            return item if item["state"] == "Delivered" else None
    return None


def test_ends_and_waits_are_delivered_signed_retried_and_recorded(
    server: Server, client: nodus.Client, receiver: WebhookReceiver
) -> None:
    agent, hook, run, waiter = unique("hook-agent"), unique("hook"), unique("done"), unique("waits")
    _setup(client, agent)
    applied = client.apply("webhooks", webhook_document(hook, receiver.url + "/events", secret="hook-key"))
    assert applied.created and applied.resource["spec"]["events"][0] == "run.succeeded"
    assert "whsec_" not in str(applied.resource)
    receiver.script(500)  # the run's end is refused once, then taken
    _run(client, run, agent)
    record = wait_for(
        lambda: _delivered(client, hook, "run.succeeded", run), timeout=90, message="the run's end delivered"
    )
    assert [a["statusCode"] for a in record["attempts"]] == [500, 200]
    assert record["attempts"][0]["error"] == "HTTP 500" and record["attempts"][1]["durationMs"] >= 0
    arrived = receiver.of_type("run.succeeded", run)
    assert [r.status for r in arrived] == [500, 200] and {r.path for r in arrived} == {"/events"}
    assert all(verify(SECRET, r) for r in arrived)
    assert {r.headers["webhook-id"] for r in arrived} == {record["eventId"]}  # the receiver dedups by it
    data = arrived[1].event["data"]
    assert (data["project"], data["phase"], data["reason"], data["agent"]) == (
        PROJECT,
        "Succeeded",
        "Completed",
        agent,
    )
    assert data["uid"] == client.get("agentruns", run)["metadata"]["uid"] and "totalUSD" in data["cost"]

    _run(client, waiter, agent, keepAlive=True)
    waited = wait_for(
        lambda: receiver.of_type("run.waiting", waiter), timeout=90, message="the keep-alive run's wait"
    )
    assert waited[0].event["data"]["reason"] == "AwaitingMessage" and verify(SECRET, waited[0])
    client.cancel_run(waiter)

    group = unique("hooked")
    only = unique("only-group")
    client.apply(
        "webhooks",
        webhook_document(
            only, receiver.url + "/group", secret="hook-key", group=group, events=["group.succeeded"]
        ),
    )
    client.create(
        "agentgroups",
        {"apiVersion": V1, "kind": "AgentGroup", "metadata": {"name": group}, "spec": {"agent": agent}},
    )
    member = {"agent": agent, "group": group, "taskKey": "t1", "input": "What is 3 + 3?"}
    client.create("agentruns", {"apiVersion": V1, "kind": "AgentRun", "metadata": {}, "spec": member})
    client.patch("agentgroups", group, {"spec": {"sealed": True}})
    ended = wait_for(
        lambda: [r for r in receiver.of_type("group.succeeded", group) if r.path == "/group"],
        timeout=120,
        message="the group's end at the group's webhook",
    )
    assert verify(SECRET, ended[0]) and ended[0].event["data"]["counts"]["succeeded"] == 1
    # The group's webhook got the group's end alone; the project's got its member's end too.
    assert {r.event["type"] for r in receiver.received if r.path == "/group"} == {"group.succeeded"}
    wait_for(lambda: _delivered(client, hook, "run.succeeded", f"{group}-t1"), timeout=60, message="member")
    status = client.get("webhooks", hook)["status"]
    assert status["delivered"] >= 3 and status["consecutiveFailures"] == 0 and status["lastSuccessAt"]
    for name in (hook, only):
        client.delete("webhooks", name)


def test_a_control_plane_killed_between_attempts_still_delivers(
    server: Server, client: nodus.Client, receiver: WebhookReceiver, ray_driver: Any
) -> None:
    from ray.util.state import list_actors

    agent, hook, run = unique("hook-agent"), unique("hook"), unique("survives")
    _setup(client, agent)
    client.apply("webhooks", webhook_document(hook, receiver.url + "/restart", secret="hook-key"))
    receiver.script(*([503] * 200))  # refused until the control plane has been killed
    _run(client, run, agent)
    records = DeliveryRecords(server.store())

    def failed_once() -> bool:
        found = [r for r in records.load(PROJECT, hook) if r.eventType == "run.succeeded"]
        return bool(found and found[0].attempts)

    wait_for(failed_once, timeout=90, interval=0.1, message="a first attempt recorded as failed")
    (actor,) = list_actors(
        filters=[("name", "=", "nodus-control-plane"), ("state", "=", "ALIVE")], detail=True
    )
    os.kill(int(actor.pid or 0), signal.SIGKILL)
    receiver.script()  # from now on every request is taken

    def delivered() -> dict[str, Any] | None:
        try:
            return _delivered(client, hook, "run.succeeded", run)
        except nodus.errors.Unavailable:
            return None  # the control plane is restarting

    record = wait_for(delivered, timeout=180, interval=0.5, message="the delivery after the restart")
    codes = [a["statusCode"] for a in record["attempts"]]
    assert codes[-1] == 200 and set(codes[:-1]) == {503}
    arrived = receiver.of_type("run.succeeded", run)
    assert {r.headers["webhook-id"] for r in arrived} == {record["eventId"]} and verify(SECRET, arrived[-1])
    client.delete("webhooks", hook)


def test_bad_webhooks_are_refused_by_the_api_and_the_cli(
    server: Server, client: nodus.Client, receiver: WebhookReceiver
) -> None:
    _setup(client, unique("hook-agent"))
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"url": "http://127.0.0.1:8000/"}, "spec.url", "not a public address"),  # not the opened 127.0.0.3
        ({"url": "http://169.254.169.254/latest"}, "spec.url", "not a public address"),
        ({"url": "ftp://example.com/x"}, "spec.url", "is not an http(s) URL"),
        ({"events": ["run.exploded"]}, "spec.events[0]", "Input should be"),
        ({"secretRef": {"name": "no-such-secret", "key": "k"}}, "spec.secretRef.name", "not found"),
    ]
    with server.http() as http:
        for change, field, says in cases:
            spec = {"url": receiver.url, "secretRef": {"name": "hook-key", "key": "signingSecret"}, **change}
            body = {"apiVersion": V1, "kind": "Webhook", "metadata": {"name": "bad"}, "spec": spec}
            answer = http.post(f"{BASE}/webhooks", json=body)
            assert answer.status_code == 422, answer.text
            error = answer.json()
            assert (
                error["code"] == "Invalid" and error["details"]["field"] == field and says in error["message"]
            )
        assert http.get(f"{BASE}/webhooks/bad").status_code == 404
        assert http.get(f"{BASE}/webhooks/bad/deliveries").json()["code"] == "NotFound"
    env = {**server.env, "NODUS_PROJECT": PROJECT}
    refused = _cli(server, env, "webhook", "create", "bad", "--url", "http://10.0.0.1/hook")
    assert refused.returncode != 0 and refused.stdout == ""
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: Invalid: Webhook spec.url: 10.0.0.1, which is not a public address")
    assert "bad-signing" not in {s["metadata"]["name"] for s in client.list("secrets")}  # nothing left behind
    refused = _cli(server, env, "webhook", "create", "bad", "--url", "file:///etc/passwd")
    assert refused.returncode != 0 and refused.stderr.startswith("error: Invalid: Webhook spec.url:")


def _cli(server: Server, env: dict[str, str], *args: str) -> Any:
    return subprocess.run([NODUS, *args], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_cli_creates_lists_tests_and_deletes_a_webhook(
    server: Server, client: nodus.Client, receiver: WebhookReceiver
) -> None:
    env = {**server.env, "NODUS_PROJECT": PROJECT}
    hook = unique("cli-hook")
    created = _cli(
        server, env, "webhook", "create", hook, "--url", receiver.url + "/cli", "--event", "run.failed"
    )
    assert created.returncode == 0, created.stderr
    first, second = created.stdout.strip().splitlines()
    assert first == f"webhook/{hook} created"
    secret = second.rsplit(" ", 1)[1]
    assert second.startswith(f"signing secret (shown once; kept in secret/{hook}-signing): whsec_")
    listed = _cli(server, env, "get", "webhooks")
    assert listed.returncode == 0 and hook in listed.stdout and "run.failed" in listed.stdout
    assert listed.stdout.splitlines()[0].split()[:4] == ["NAME", "URL", "EVENTS", "GROUP"]
    shown = _cli(server, env, "get", f"webhook/{hook}", "-o", "yaml")
    assert "whsec_" not in shown.stdout and "signingSecret" in shown.stdout
    tested = _cli(server, env, "webhook", "test", hook)
    assert tested.returncode == 0 and "webhook.test" in tested.stdout
    (arrived,) = wait_for(
        lambda: [r for r in receiver.of_type("webhook.test") if r.path == "/cli"], timeout=60
    )
    assert verify(secret, arrived) and arrived.event["data"]["name"] == hook
    wait_for(
        lambda: "Delivered" in _cli(server, env, "webhook", "deliveries", hook).stdout,
        timeout=60,
        message="the test event recorded as delivered",
    )
    deliveries = _cli(server, env, "webhook", "deliveries", hook, "-o", "json")
    assert deliveries.returncode == 0 and '"statusCode": 200' in deliveries.stdout
    deleted = _cli(server, env, "delete", f"webhook/{hook}")
    assert deleted.returncode == 0, deleted.stderr
    gone = _cli(server, env, "webhook", "deliveries", hook)
    assert gone.returncode != 0 and gone.stderr.startswith("error: NotFound: webhook")
