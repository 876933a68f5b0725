"""Shared rate limits end to end: runs on a key the operator limited (NODUS_RATE_LIMITS of the
session, `tests.fakes.rate_limits`) against the fake Messages API enforcing the same limit.

Every run succeeds; while the limiter holds their calls back they show Waiting / RateLimited
and their group's blockedReasons counts them; a run's message names the key by its
fingerprint, never the key; a limiter that is killed is made again and no run fails; the SDK's
answer() waits through RateLimited.
"""

from __future__ import annotations

from typing import Any

from nodus_ray.core.rate_limits import key_fingerprint
from nodus_ray.runtime.rate_limiter import limiter_name
from tests.fakes.anthropic_api import FakeMessagesAPI
from tests.fakes.rate_limits import SESSION_RATE_LIMIT_RPM, SESSION_RATE_LIMITED_KEY, FakeRateLimit

from .conftest import Server, unique, wait_for
from .kit import AGENTS, V1, batch, finished, get_group, group, member, runs_of, seal

FINGERPRINT = key_fingerprint(SESSION_RATE_LIMITED_KEY)


def _limited_agent(server: Server) -> str:
    """A BYOK agent on the session's rate-limited key, haiku only (the limited family)."""
    secret, name = unique("limited-key"), unique("limited")
    created = server.cli(
        "create", "secret", secret, "--from-literal", f"ANTHROPIC_API_KEY={SESSION_RATE_LIMITED_KEY}"
    )
    assert created.returncode == 0, created.stderr
    spec = {
        "system": "Answer in one sentence.",
        "model": {"access": "BYOK", "families": ["haiku"], "apiKeySecret": secret},
    }
    with server.http() as http:
        response = http.put(
            f"{AGENTS}/{name}",
            json={"apiVersion": V1, "kind": "Agent", "metadata": {"name": name}, "spec": spec},
        )
        assert response.status_code in (200, 201), response.text
    return name


def _enforce(fake: FakeMessagesAPI) -> None:
    # The API's own limit: the same budget, over a window of 4 s (2 calls' worth of burst).
    fake.rate_limit(FakeRateLimit(rpm=SESSION_RATE_LIMIT_RPM, window_seconds=4))


def test_runs_on_a_limited_key_wait_rate_limited_counted_by_their_group_and_all_succeed(
    server: Server, fake_anthropic: FakeMessagesAPI
) -> None:
    _enforce(fake_anthropic)
    agent = _limited_agent(server)
    name = unique("limited-group")
    group(server, name, agent, limits={"maxActive": 6})
    response = batch(server, [member(name, agent, f"t{i}", f"What is {i} + {i}?") for i in range(6)])
    assert response.status_code == 201, response.text
    seal(server, name)

    def seen_waiting() -> tuple[dict[str, Any], dict[str, Any]] | None:
        status = get_group(server, name).get("status") or {}
        waiting = [
            run
            for run in runs_of(server, name)
            if (run["status"]["phase"], run["status"].get("reason")) == ("Waiting", "RateLimited")
        ]
        if waiting and (status.get("blockedReasons") or {}).get("RateLimited", 0) >= 1:
            return status, waiting[0]
        return None

    status, run = wait_for(seen_waiting, timeout=90, interval=0.1, message="a member Waiting/RateLimited")
    assert status["waitingReasons"].get("RateLimited", 0) >= 1
    message = run["status"]["message"]
    assert f"rate limit of haiku on key {FINGERPRINT}" in message and SESSION_RATE_LIMITED_KEY not in message
    shown = server.cli("get", f"agentrun/{run['metadata']['name']}", "-o", "json")
    assert shown.returncode == 0 and SESSION_RATE_LIMITED_KEY not in shown.stdout

    done = finished(server, name, timeout=180)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    runs = runs_of(server, name)
    assert [r["status"]["phase"] for r in runs] == ["Succeeded"] * 6
    assert "RateLimited" not in done["status"]["blockedReasons"]
    # Each run's one call was let through once; a 429 on the way (timing) was retried by the
    # limiter, not by the SDK, and failed no run.
    assert len(fake_anthropic.admitted) == 6


def test_a_killed_limiter_is_made_again_and_the_sdk_waits_through_rate_limited(
    server: Server, sdk_env: Server, fake_anthropic: FakeMessagesAPI, ray_driver: Any
) -> None:
    import nodus

    _enforce(fake_anthropic)
    name = _limited_agent(server)
    agent = nodus.Agent.from_name(name)
    runs = [agent.submit(f"What is {i} * 3?") for i in range(4)]
    limiter = wait_for(
        lambda: _find(ray_driver, limiter_name(FINGERPRINT, "haiku")), timeout=90, message="the limiter actor"
    )
    ray_driver.kill(limiter, no_restart=True)
    for run in runs:
        assert run.answer(), run.name  # waits through Waiting/RateLimited, to the answer
        assert run.wait().phase == "Succeeded"
    assert _find(ray_driver, limiter_name(FINGERPRINT, "haiku")) is not None  # made again


def _find(ray: Any, actor: str) -> Any:
    try:
        return ray.get_actor(actor, namespace="nodus")
    except ValueError:
        return None
