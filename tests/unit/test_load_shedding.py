"""Past its limit of requests in flight the API answers 429 at once, and the SDK waits and retries."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from nodus.client import Client
from nodus.errors import TooManyRequests
from nodus_ray.control.list_query import ListPage
from nodus_serve.app import create_app
from nodus_serve.load_shedding import max_inflight_from_env
from tests.fakes.control_plane import client_over
from tests.unit.test_control_support import until


class _HeldControlPlane:
    """Answers every call only once released, so requests pile up in flight."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls = 0

    async def call(self, method: str, *args: Any) -> Any:
        if method == "authenticate":  # the token is looked up before anything is held
            return {"name": "t", "project": "default", "role": "read"}
        self.calls += 1
        await self.release.wait()
        if method == "list_page":
            return ListPage()
        return [] if method.startswith("list_") else {"status": "ready"}


async def _burst(limit: int, requests: int) -> tuple[list[httpx.Response], _HeldControlPlane]:
    cp = _HeldControlPlane()
    app = create_app(client_over(cp.call), max_inflight=limit)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://api",
        headers={"Authorization": "Bearer nodus_test"},
    ) as http:
        pending = [asyncio.ensure_future(http.get("/v1/projects/default/agents")) for _ in range(requests)]
        # The first `limit` are in flight, held by the control plane; the rest are answered
        # while those are still held.
        await until(
            lambda: cp.calls >= limit and sum(task.done() for task in pending) >= requests - limit,
            what=f"{limit} requests held and the other {requests - limit} answered",
        )
        health = await http.get("/healthz")  # not counted: still answers
        assert health.status_code == 200
        shed = [task for task in pending if task.done()]
        assert len(shed) == requests - limit and cp.calls == limit
        cp.release.set()
        return [await task for task in pending], cp


def test_requests_past_the_limit_are_refused_at_once_and_the_rest_answered() -> None:
    responses, cp = asyncio.run(_burst(limit=4, requests=10))
    refused = [r for r in responses if r.status_code == 429]
    assert len(refused) == 6 and sum(r.status_code == 200 for r in responses) == 4
    assert cp.calls == 4  # a refused request never reached the control plane
    body = refused[0].json()
    assert body["code"] == "TooManyRequests" and body["details"] == {"limit": 4, "retryAfter": 1}
    assert refused[0].headers["retry-after"] == "1"


def test_the_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODUS_API_MAX_INFLIGHT", "7")
    assert max_inflight_from_env() == 7
    for bad in ("0", "lots", "-3"):
        monkeypatch.setenv("NODUS_API_MAX_INFLIGHT", bad)
        with pytest.raises(ValueError, match="NODUS_API_MAX_INFLIGHT"):
            max_inflight_from_env()


def test_the_sdk_waits_retry_after_and_sends_any_request_again(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = [
        httpx.Response(429, headers={"Retry-After": "2"}, json={"code": "TooManyRequests"}),
        httpx.Response(429, headers={"Retry-After": "junk"}, json={"code": "TooManyRequests"}),
        httpx.Response(201, json={"metadata": {"name": "r"}}),
    ]
    sent: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request.method)
        return answers.pop(0)

    slept: list[float] = []
    monkeypatch.setattr("nodus.client.time.sleep", slept.append)
    client = Client(api_url="http://nodus.test", project="default", transport=httpx.MockTransport(handle))
    created = client.create(
        "agentruns",
        {"apiVersion": "nodus.dev/v1", "kind": "AgentRun", "metadata": {"name": "r"}, "spec": {"agent": "a"}},
    )
    assert created == {"metadata": {"name": "r"}}
    assert sent == ["POST", "POST", "POST"] and slept == [2.0, 1.0]


def test_the_sdk_gives_up_after_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr("nodus.client.time.monotonic", lambda: clock[0])
    monkeypatch.setattr("nodus.client.time.sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    client = Client(
        api_url="http://nodus.test",
        project="default",
        transport=httpx.MockTransport(
            lambda _: httpx.Response(
                429,
                headers={"Retry-After": "10"},
                json={"code": "TooManyRequests", "message": "busy", "details": {}},
            )
        ),
    )
    with pytest.raises(TooManyRequests):
        client.get("agents", "a")
    assert 110 <= clock[0] <= 120
