"""Webhooks through every layer but Ray: the real API app (auth, routes, errors) over the real
control plane facade and services (fake run actors at the Ray boundary), served by uvicorn in a
thread, driven by the SDK's `Client` and the `nodus` CLI, delivering to a real receiver."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from typer.testing import CliRunner

import nodus
from nodus.cli import main as cli
from nodus.client_webhooks import webhook_document
from nodus.errors import Invalid
from nodus_ray.control.plane import ControlPlane
from nodus_ray.settings import ServerSettings
from nodus_serve.app import create_app
from tests.fakes.control_plane import client_over
from tests.fakes.webhook_receiver import WebhookReceiver, running_receiver, verify
from tests.unit.test_control_support import FakeGraders, FakeGroupSupervisors, FakeRunActors

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class _Service:
    """The API and the control plane on one event loop of their own thread."""

    def __init__(self, tmp_path: Path) -> None:
        settings = ServerSettings(
            storage_uri=str(tmp_path / "storage"),
            sandbox_root=str(tmp_path / "sandboxes"),
            secret_key_file=str(tmp_path / "secret.key"),
            run_pool_per_node=0,
            webhook_allow_private="127.0.0.1/32",
            webhook_retry_schedule="0.05s,0.1s",
        )
        self.run_actors = FakeRunActors()
        self.loop = asyncio.new_event_loop()
        self.plane = ControlPlane(
            settings, run_actors=self.run_actors, group_actors=FakeGroupSupervisors(), graders=FakeGraders()
        )
        self.run_actors.report = self.plane.report
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

        async def call(method: str, *args: Any) -> Any:
            return await getattr(self.plane, method)(*args)

        app = create_app(client_over(call))
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self.server.serve(),))
        self.thread.start()
        self.token = self.run(self.plane.ensure_operator_token(None))

    def run(self, work: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(30)

    def stop(self) -> None:
        self.run(self.plane._services.webhooks.close())
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[_Service]:
    running = _Service(tmp_path)
    try:
        running.run(_until_started(running))
        yield running
    finally:
        running.stop()


async def _until_started(service: _Service) -> None:
    """The receiver's server is listening, or the test fails after 20 s (never hangs)."""
    async with asyncio.timeout(20):
        while not service.server.started:
            await asyncio.sleep(0.01)


def _wait(condition: Any, what: str) -> Any:
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_sdk_and_the_cli_over_the_api(service: _Service, monkeypatch: pytest.MonkeyPatch) -> None:
    client = nodus.Client(service.url, project="demo", token=service.token)
    secret = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Secret",
        "metadata": {"name": "k"},
        "stringData": {"s": SECRET},
    }
    client.apply("secrets", secret)
    client.apply(
        "agents", {"apiVersion": "nodus.dev/v1", "kind": "Agent", "metadata": {"name": "a"}, "spec": {}}
    )
    with pytest.raises(Invalid, match="169.254.169.254, which is not a public address") as refused:
        client.apply("webhooks", webhook_document("bad", "http://169.254.169.254/", secret="k", key="s"))
    assert refused.value.details["field"] == "spec.url"
    with running_receiver() as receiver:
        _deliveries_over_the_sdk(service, client, receiver)
        monkeypatch.setenv("NODUS_API_URL", service.url)
        monkeypatch.setenv("NODUS_TOKEN", service.token)
        monkeypatch.setenv("NODUS_PROJECT", "demo")
        _cli(receiver)


def _deliveries_over_the_sdk(service: _Service, client: nodus.Client, receiver: WebhookReceiver) -> None:
    applied = client.apply("webhooks", webhook_document("h", receiver.url + "/sdk", secret="k", key="s"))
    assert applied.created and applied.result == "created"
    assert client.list("webhooks")[0]["metadata"]["name"] == "h"
    receiver.script(500)
    client.create(
        "agentruns",
        {
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentRun",
            "metadata": {"name": "r1"},
            "spec": {"agent": "a"},
        },
    )
    (actor,) = _wait(lambda: service.run_actors.of("r1"), "the run's actor")
    service.loop.call_soon_threadsafe(actor.end, {"phase": "Succeeded", "reason": "Completed"})
    delivered = _wait(
        lambda: [d for d in client.webhook_deliveries("h") if d["state"] == "Delivered"], "the delivery"
    )
    assert [a["statusCode"] for a in delivered[0]["attempts"]] == [500, 200]
    arrived = receiver.of_type("run.succeeded", "r1")
    assert all(verify(SECRET, r) for r in arrived) and len(arrived) == 2
    assert client.get("webhooks", "h")["status"]["delivered"] == 1
    record = client.send_webhook_test("h")
    assert record["state"] == "Pending" and record["eventType"] == "webhook.test"
    _wait(lambda: receiver.of_type("webhook.test"), "the test event")
    with pytest.raises(nodus.errors.Invalid, match="limit"):
        client.webhook_deliveries("h", limit=500)
    assert client.delete("webhooks", "h") is not None
    with pytest.raises(nodus.errors.NotFound):
        client.webhook_deliveries("h")


def _cli(receiver: WebhookReceiver) -> None:
    runner = CliRunner()
    created = runner.invoke(
        cli.app, ["webhook", "create", "c", "--url", receiver.url + "/cli", "--event", "run.failed"]
    )
    assert created.exit_code == 0, created.output
    assert created.stdout.splitlines()[0] == "webhook/c created"
    secret = created.stdout.splitlines()[1].rsplit(" ", 1)[1]
    listed = runner.invoke(cli.app, ["get", "webhooks"])
    assert listed.exit_code == 0 and "run.failed" in listed.stdout and "c " in listed.stdout
    tested = runner.invoke(cli.app, ["webhook", "test", "c"])
    assert tested.exit_code == 0, tested.output
    (arrived,) = _wait(
        lambda: [r for r in receiver.of_type("webhook.test") if r.path == "/cli"], "the CLI's test"
    )
    assert verify(secret, arrived)
    _wait(lambda: "Delivered" in runner.invoke(cli.app, ["webhook", "deliveries", "c"]).stdout, "Delivered")
    bad = runner.invoke(cli.app, ["webhook", "create", "d", "--url", "http://10.0.0.1/"])
    assert bad.exit_code != 0 and bad.stdout == ""
    (line,) = bad.stderr.strip().splitlines()
    assert line.startswith("error: Invalid: Webhook spec.url: 10.0.0.1, which is not a public address")
    secrets = runner.invoke(cli.app, ["get", "secrets", "-o", "name"]).stdout
    assert "secret/d-signing" not in secrets and "secret/c-signing" in secrets
    deleted = runner.invoke(cli.app, ["delete", "webhook/c"])
    assert deleted.exit_code == 0, deleted.output
