"""A bounded load test on loopback: the API sheds a burst with 429 and loses nothing it accepted.

Hundreds of clients at once create group runs, send messages to one keep-alive run and read
status. The server is the session's, with its default limit of requests in flight
(``NODUS_API_MAX_INFLIGHT``, 128): the burst is larger, so some requests must be refused with
429 and ``Retry-After``; none may fail with 5xx. Every client then retries what was refused, as
the SDK does, and the test checks that each accepted create and message is there exactly once.
The group's cap is below one run's cap, so its runs stay queued and the test measures the API,
not run actors.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx

from . import kit
from .conftest import Server, unique, wait_for

CLIENTS = 300


async def _client(
    http: httpx.AsyncClient, index: int, group: str, agent: str, talker: str, statuses: Counter[int]
) -> tuple[str, str]:
    """One client: a run, a message, a status read; each sent again after a 429, as the SDK does."""
    key = f"load-{index:04d}"
    requests = [
        (
            "POST",
            kit.RUNS,
            {
                "json": {
                    "apiVersion": kit.V1,
                    "kind": "AgentRun",
                    "spec": {"agent": agent, "group": group, "taskKey": key, "input": "What is 1 + 1?"},
                }
            },
        ),
        ("POST", f"{kit.RUNS}/{talker}/messages", {"json": {"payload": f"note {index}", "messageKey": key}}),
        ("GET", f"{kit.RUNS}/{talker}", {}),
    ]
    for method, path, extra in requests:
        while True:
            response = await http.request(method, path, **extra)
            statuses[response.status_code] += 1
            if response.status_code != 429:
                break
            assert response.json()["code"] == "TooManyRequests"
            await asyncio.sleep(float(response.headers["Retry-After"]))
        assert response.status_code in (200, 201, 202), (method, path, response.status_code, response.text)
    return key, f"note {index}"


async def _burst(
    server: Server, group: str, agent: str, talker: str
) -> tuple[list[tuple[str, str]], Counter[int]]:
    statuses: Counter[int] = Counter()
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(
        base_url=server.api_url,
        timeout=120.0,
        limits=limits,
        headers={"Authorization": f"Bearer {server.token}"},
    ) as http:
        done = await asyncio.gather(
            *(_client(http, i, group, agent, talker, statuses) for i in range(CLIENTS))
        )
    return list(done), statuses


def test_a_burst_is_shed_with_429_and_nothing_accepted_is_lost(server: Server) -> None:
    agent, group, talker = unique("load"), unique("lg"), unique("talker")
    kit.agent(server, agent, cap="0.10")
    kit.group(
        server, group, agent, maxCostUSD="0.05", limits={"maxActive": 1}
    )  # no run fits: all stay queued
    with server.http() as http:
        created = http.post(
            kit.RUNS,
            json={
                "apiVersion": kit.V1,
                "kind": "AgentRun",
                "metadata": {"name": talker},
                "spec": {"agent": agent, "input": "Say hi.", "keepAlive": True},
            },
        )
        assert created.status_code == 201, created.text

    accepted, statuses = asyncio.run(_burst(server, group, agent, talker))
    print(f"load: {CLIENTS} clients, answers by status {dict(sorted(statuses.items()))}")

    assert statuses[429] > 0, f"a burst of {CLIENTS * 3} requests was never shed: {statuses}"
    assert not [status for status in statuses if status >= 500], statuses
    # Every accepted run exists once, still queued; every accepted message is in the inbox once.
    runs = kit.runs_of(server, group)
    assert sorted(run["spec"]["taskKey"] for run in runs) == sorted(key for key, _ in accepted)
    assert {run["status"]["phase"] for run in runs} == {"Pending"}
    store = server.store()
    inbox = [
        store.read_json(f"projects/default/agentruns/{talker}/messages/{name}")
        for name in store.list_dir(f"projects/default/agentruns/{talker}/messages")
    ]
    assert sorted(message["messageKey"] for message in inbox) == sorted(key for key, _ in accepted)
    assert len({message["seq"] for message in inbox}) == CLIENTS

    with server.http() as http:
        assert http.post(f"{kit.GROUPS}/{group}/cancel").status_code == 200
        assert http.post(f"{kit.RUNS}/{talker}/cancel").status_code == 200
    wait_for(
        lambda: kit.get_group(server, group)["status"]["phase"] == "Cancelled",
        timeout=120,
        message="the load test's group to be cancelled",
    )
