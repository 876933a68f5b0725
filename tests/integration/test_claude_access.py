"""Claude access end to end: the real anthropic SDK inside run actors, against a local fake API.

Every test here drives the real server (`nodus up`, Ray, Serve) and checks what reached the fake
Messages API, what the run recorded and what it cost, to the millionth of a dollar.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.anthropic_api import error_reply, text_reply, tool_use_reply

from .conftest import Server, unique, wait_for
from .kit import workspace_of
from .test_durability import _actor_pid

AGENTS = "/v1/projects/default/agents"
RUNS = "/v1/projects/default/agentruns"
SECRETS = "/v1/projects/default/secrets"
MICRO = Decimal("0.000001")


def _agent(server: Server, name: str, **spec: Any) -> None:
    with server.http() as http:
        response = http.put(
            f"{AGENTS}/{name}",
            json={"apiVersion": "nodus.dev/v1", "kind": "Agent", "metadata": {"name": name}, "spec": spec},
        )
        assert response.status_code in (200, 201), response.text


def _run(server: Server, agent: str, prompt: str, project: str = "default") -> str:
    name = unique("run")
    with server.http() as http:
        response = http.post(
            f"/v1/projects/{project}/agentruns",
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "AgentRun",
                "metadata": {"name": name},
                "spec": {"agent": agent, "input": prompt},
            },
        )
        assert response.status_code == 201, response.text
    return name


def _settled(server: Server, name: str, project: str = "default", timeout: float = 90) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        with server.http() as http:
            run = http.get(f"/v1/projects/{project}/agentruns/{name}").json()
        return run if run["status"]["phase"] in ("Succeeded", "Failed", "Cancelled", "Waiting") else None

    return wait_for(done, timeout=timeout, message=f"run {name} to settle")


def _requests_for(fake: Any, marker: str) -> list[Any]:
    """The fake's requests whose conversation starts with the prompt ``marker``."""
    found = []
    for request in fake.requests:
        messages = request.body.get("messages") or []
        first = messages[0]["content"] if messages else ""
        text = first if isinstance(first, str) else json.dumps(first)
        if marker in text:
            found.append(request)
    return found


def _billed(raw: Decimal) -> Decimal:
    return (raw / Decimal("0.875")).quantize(MICRO, rounding=ROUND_CEILING)


@pytest.fixture
def server_key(server: Server) -> Iterator[str]:
    """The server runs on its own (fake) Anthropic key for one test, then back on the offline model."""
    key = f"sk-ant-server-{uuid.uuid4().hex}"
    up = server.up(ANTHROPIC_API_KEY=key)
    assert up.returncode == 0, up.stderr
    assert "anthropic" in up.stdout
    try:
        yield key
    finally:
        down = server.up(ANTHROPIC_API_KEY="")
        assert down.returncode == 0 and "offline" in down.stdout, down.stderr
    assert _files_containing(key, server) == [], "the server's key leaked into a file"


def _files_containing(secret: str, server: Server) -> list[str]:
    """Every file the server writes (storage, sandboxes, every log of the session's Ray, Serve's
    among them) holding ``secret``."""
    needle = secret.encode()
    files = [path for root in (server.storage, server.sandbox_root) for path in root.rglob("*")]
    logs = server.ray_logs()
    assert any("serve" in log.relative_to(server.base).parts for log in logs), "Serve's logs were read"
    return [str(path) for path in files + logs if path.is_file() and needle in path.read_bytes()]


def test_byok_run_uses_the_secret_key_charges_nothing_and_leaks_nowhere(
    server: Server, fake_anthropic: Any
) -> None:
    key = f"sk-ant-byok-{uuid.uuid4().hex}"
    secret, agent = unique("anthropic-key"), unique("byok")
    created = server.cli("create", "secret", secret, "--from-literal", f"ANTHROPIC_API_KEY={key}")
    assert created.returncode == 0, created.stderr
    _agent(
        server,
        agent,
        system="You are careful.",
        maxTokens=777,
        model={"access": "BYOK", "name": "claude-sonnet-5-5", "apiKeySecret": secret},
    )
    marker = f"byok-{uuid.uuid4().hex[:6]}"
    fake_anthropic.script(
        tool_use_reply("echo hi", usage={"input_tokens": 120, "output_tokens": 30}),
        text_reply("It printed hi.", usage={"input_tokens": 160, "output_tokens": 10}),
    )
    run = _settled(server, _run(server, agent, f"{marker}: use the shell to print hi"))
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert run["status"]["cost"]["totalUSD"] == "0" and run["status"]["cost"]["limitUSD"] is None
    turn = run["status"]["turns"][0]
    assert (turn["model"], turn["routing"], turn["inputTokens"], turn["outputTokens"]) == (
        "claude-sonnet-5-5",
        "pinned",
        280,
        40,
    )

    sent = _requests_for(fake_anthropic, marker)
    assert len(sent) == 2
    first = sent[0]
    assert first.api_key == key
    assert first.body["model"] == "claude-sonnet-5-5"
    assert first.body["max_tokens"] == 777
    assert first.body["system"][0]["text"] == "You are careful."
    assert first.body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert [tool["name"] for tool in first.body["tools"]] == ["bash"]
    assert first.body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    second = sent[1].body["messages"]
    assert second[-1]["content"][0]["type"] == "tool_result"
    assert "exit code 0" in json.dumps(second[-1]["content"][0]["content"])

    # The key is nowhere the server writes: storage, sandboxes, Ray's logs, the API's answers.
    with server.http() as http:
        shown = (
            http.get(f"{SECRETS}/{secret}").text
            + http.get(SECRETS).text
            + http.get(f"{RUNS}/{run['metadata']['name']}/steps").text
        )
    assert key not in shown
    assert "ANTHROPIC_API_KEY" in shown  # the key's name is shown, never its value
    assert _files_containing(key, server) == []


def test_byok_without_a_usable_secret_fails_with_a_clear_reason(server: Server) -> None:
    agent_missing, agent_empty, secret = unique("byok-missing"), unique("byok-empty"), unique("not-a-key")
    assert server.cli("create", "secret", secret, "--from-literal", "OTHER=x").returncode == 0
    _agent(
        server,
        agent_missing,
        model={"access": "BYOK", "name": "claude-haiku-5-5", "apiKeySecret": unique("nope")},
    )
    _agent(server, agent_empty, model={"access": "BYOK", "name": "claude-haiku-5-5", "apiKeySecret": secret})
    missing = _settled(server, _run(server, agent_missing, "hello"))
    empty = _settled(server, _run(server, agent_empty, "hello"))
    assert (missing["status"]["phase"], missing["status"]["reason"]) == ("Failed", "SecretNotFound")
    assert (empty["status"]["phase"], empty["status"]["reason"]) == ("Failed", "SecretKeyMissing")
    assert "ANTHROPIC_API_KEY" in empty["status"]["message"]


def test_a_rejected_key_fails_the_run_once_without_a_retry_storm(server: Server, fake_anthropic: Any) -> None:
    secret, agent = unique("bad-key"), unique("byok-bad")
    bad = f"sk-ant-bad-{uuid.uuid4().hex}"
    assert (
        server.cli("create", "secret", secret, "--from-literal", f"ANTHROPIC_API_KEY={bad}").returncode == 0
    )
    _agent(server, agent, model={"access": "BYOK", "name": "claude-haiku-5-5", "apiKeySecret": secret})
    marker = f"reject-{uuid.uuid4().hex[:6]}"
    fake_anthropic.accept_keys({"sk-ant-only-this-one"})
    try:
        run = _settled(server, _run(server, agent, f"{marker} hello"))
    finally:
        fake_anthropic.accept_keys(None)
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "ModelAuthenticationFailed")
    assert bad not in (run["status"]["message"] or "")
    assert len(_requests_for(fake_anthropic, marker)) == 1


def test_server_key_routes_bills_exactly_and_debits_credits(
    server: Server, fake_anthropic: Any, server_key: str
) -> None:
    agent = unique("nodus-claude")
    _agent(
        server,
        agent,
        system="Answer briefly.",
        maxTokens=1024,
        perRunMaxCostUSD="0.10",
        model={"access": "Nodus", "families": ["haiku", "sonnet"]},
    )
    with server.http() as http:
        before = Decimal(http.get("/v1/projects/default/credits").json()["balanceUSD"])
    prompt = f"What is the capital of France? ({uuid.uuid4().hex[:6]})"
    usage = {
        "input_tokens": 100,
        "output_tokens": 20,
        "cache_creation_input_tokens": 40,
        "cache_read_input_tokens": 300,
    }
    fake_anthropic.script(text_reply("Paris.", usage=usage))
    run = _settled(server, _run(server, agent, prompt))
    assert run["status"]["phase"] == "Succeeded", run["status"]

    sent = _requests_for(fake_anthropic, prompt)
    assert len(sent) == 1 and sent[0].api_key == server_key
    assert sent[0].body["model"] == "claude-haiku-5-5"  # a simple prompt is routed to haiku

    # Prices per million tokens (effective 2026-11-01): haiku 1 in, 5 out, 1.25 cache write,
    # 0.10 cache read; the jev router 0.10 per input token on ceil(chars/4) + 64.
    model_raw = (100 * Decimal(1) + 20 * Decimal(5) + 40 * Decimal("1.25") + 300 * Decimal("0.10")) / 10**6
    model_cost = _billed(model_raw.quantize(MICRO, rounding=ROUND_CEILING))
    router_tokens = -(-len(prompt) // 4) + 64
    router_cost = _billed((router_tokens * Decimal("0.10") / 10**6).quantize(MICRO, rounding=ROUND_CEILING))
    turn = run["status"]["turns"][0]
    assert (turn["family"], turn["routing"], turn["model"]) == ("haiku", "jev", "claude-haiku-5-5")
    assert (turn["cacheCreationTokens"], turn["cacheReadTokens"]) == (40, 300)
    assert Decimal(turn["costUSD"]) == model_cost + router_cost
    assert Decimal(run["status"]["cost"]["totalUSD"]) == model_cost + router_cost

    with server.http() as http:
        after = http.get("/v1/projects/default/credits").json()
        steps = http.get(f"{RUNS}/{run['metadata']['name']}/steps").json()["items"]
    assert Decimal(after["balanceUSD"]) == before - model_cost - router_cost
    assert sum(Decimal(step["costUSD"]) for step in steps) == model_cost + router_cost


def test_retries_on_429_and_overload_are_one_journaled_call(
    server: Server, fake_anthropic: Any, server_key: str
) -> None:
    agent = unique("retrying")
    _agent(server, agent, model={"access": "Nodus", "families": ["sonnet"]})
    prompt = f"Say hello ({uuid.uuid4().hex[:6]})"
    fake_anthropic.script(
        error_reply(429, "rate_limit_error", "slow down", headers={"retry-after-ms": "1"}),
        error_reply(529, "overloaded_error", "overloaded"),
        text_reply("Hello."),
    )
    run = _settled(server, _run(server, agent, prompt))
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert len(_requests_for(fake_anthropic, prompt)) == 3
    with server.http() as http:
        steps = http.get(f"{RUNS}/{run['metadata']['name']}/steps").json()["items"]
    models = [step for step in steps if step["kind"] == "model"]
    assert len(models) == 1 and models[0]["attempts"] == 1
    assert models[0]["detail"]["result"]["attempts"] == 3


def test_the_per_run_cap_stops_calls_before_they_are_made(server: Server) -> None:
    agent = unique("capped")
    _agent(server, agent, perRunMaxCostUSD="0.000010", model={"families": ["opus"]})
    run = _settled(server, _run(server, agent, "Use the shell to print the Python version"))
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Waiting", "MaxCostReached")
    assert "perRunMaxCostUSD" in run["status"]["message"]
    with server.http() as http:
        steps = http.get(f"{RUNS}/{run['metadata']['name']}/steps").json()["items"]
    assert [step["kind"] for step in steps] == ["sandbox"]  # no routing, no model call
    assert Decimal(run["status"]["cost"]["totalUSD"]) <= Decimal("0.000010")


def test_offline_runs_show_every_cost_rule(server: Server) -> None:
    agent = unique("offline-costs")
    _agent(server, agent, model={"families": ["haiku", "sonnet"]}, perRunMaxCostUSD="0.50")
    run = _settled(server, _run(server, agent, "Use the shell to print the Python version"))
    assert run["status"]["phase"] == "Succeeded"
    total = Decimal(run["status"]["cost"]["totalUSD"])
    assert Decimal(0) < total <= Decimal("0.50")
    with server.http() as http:
        steps = http.get(f"{RUNS}/{run['metadata']['name']}/steps").json()["items"]
        prices = http.get("/v1/prices").json()
    assert sum(Decimal(step["costUSD"]) for step in steps) == total
    route = next(step for step in steps if step["kind"] == "route")
    assert Decimal(route["costUSD"]) > 0 and route["detail"]["result"]["routing"] == "jev"
    assert "offline-haiku" in prices["prices"] and prices["effective"]


def _live_actors_of(project: str, run: str) -> list[Any]:
    """Live actors serving the run: their ``__repr__`` (what the dashboard shows) names it."""
    from ray.util.state import list_actors

    return [
        a
        for a in list_actors(filters=[("state", "=", "ALIVE")], limit=10000, detail=True)
        if f"run={project}/{run}," in (getattr(a, "repr_name", "") or "")
    ]


def test_credits_run_out_then_the_run_continues_when_credits_are_added(
    server: Server, ray_driver: Any
) -> None:
    project = unique("credits")
    with server.http() as http:
        http.put(
            f"/v1/projects/{project}/agents/big",
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "Agent",
                "metadata": {"name": "big"},
                "spec": {"maxTokens": 128000, "perRunMaxCostUSD": "5.00", "model": {"families": ["fable"]}},
            },
        )
    name = _run(server, "big", "What is 6 * 7?", project=project)

    def waiting() -> dict[str, Any] | None:
        with server.http() as http:
            run = http.get(f"/v1/projects/{project}/agentruns/{name}").json()
        return run if run["status"].get("reason") == "InsufficientCredits" else None

    parked = wait_for(waiting, timeout=60, message="the run to wait for credits")
    assert parked["status"]["phase"] == "Waiting"
    # Waiting costs no process: the run gives its actor back and keeps its journal.
    wait_for(
        lambda: not _live_actors_of(project, name),
        timeout=30,
        interval=0.2,
        message="the waiting run's actor to go",
    )
    # The control plane crashes while the run waits: Ray restarts it, it reloads the run from
    # storage; adding credits then starts an actor that replays the journal and goes on.
    os.kill(_actor_pid(ray_driver, "nodus-control-plane"), signal.SIGKILL)
    wait_for(
        lambda: server.cli("credits", "-p", project).returncode == 0,
        timeout=120,
        interval=0.5,
        message="the restarted control plane",
    )
    shown = server.cli("credits", "-p", project)
    assert shown.returncode == 0 and "$1.00" in shown.stdout
    added = server.cli("credits", "add", "5", "-p", project)
    assert added.returncode == 0 and "$6.00" in added.stdout
    run = _settled(server, name, project=project)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert run["status"]["answer"]["preview"].strip() == "6 * 7 = 42."
    refused = server.cli("credits", "add", "-3", "-p", project)
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1


def test_router_unavailable_falls_back_to_sonnet_or_the_nearest_family(
    server: Server, ray_driver: Any
) -> None:
    default_families, split = unique("fallback-all"), unique("fallback-split")
    _agent(server, default_families)
    _agent(server, split, model={"families": ["haiku", "opus"]})
    ray_driver.kill(ray_driver.get_actor("nodus-router", namespace="nodus"), no_restart=True)
    try:
        first = _settled(server, _run(server, default_families, "What is 1 + 1?"))
        second = _settled(server, _run(server, split, "What is 1 + 1?"))
    finally:
        assert server.up().returncode == 0  # `nodus up` brings the router back
    assert (first["status"]["turns"][0]["routing"], first["status"]["turns"][0]["family"]) == (
        "fallback",
        "sonnet",
    )
    assert (second["status"]["turns"][0]["routing"], second["status"]["turns"][0]["family"]) == (
        "fallback",
        "haiku",
    )
    assert first["status"]["phase"] == second["status"]["phase"] == "Succeeded"
    again = _settled(server, _run(server, default_families, "What is 1 + 1?"))
    assert again["status"]["turns"][0]["routing"] == "jev"


def test_bad_model_settings_are_refused(server: Server) -> None:
    with server.http() as http:
        unpriced = http.put(
            f"{AGENTS}/unpriced",
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "Agent",
                "metadata": {"name": "unpriced"},
                # On Nodus access only: a BYOK agent may name any model (decision 49, test_polish.py)
                "spec": {"model": {"access": "Nodus", "name": "claude-unknown-9"}},
            },
        )
        assert unpriced.status_code == 422
        assert unpriced.json()["code"] == "UnpricedModel"
        assert unpriced.json()["details"]["field"] == "spec.model.name"
        no_secret = http.put(
            f"{AGENTS}/nosecret",
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "Agent",
                "metadata": {"name": "nosecret"},
                "spec": {"model": {"access": "BYOK"}},
            },
        )
        assert no_secret.json()["details"]["field"] == "spec.model.apiKeySecret"
        negative = http.put(
            f"{AGENTS}/negative",
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "Agent",
                "metadata": {"name": "negative"},
                "spec": {"perRunMaxCostUSD": "-0.10"},
            },
        )
        assert negative.json()["details"]["field"] == "spec.perRunMaxCostUSD"
        secret_value = "sk-ant-never-echo-this"
        bad_secret = http.post(
            SECRETS,
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "Secret",
                "metadata": {"name": "bad"},
                "stringData": {"not a key": secret_value},
            },
        )
        assert bad_secret.status_code == 422 and secret_value not in bad_secret.text


def test_the_claude_examples_apply_and_run_within_their_cap(server: Server) -> None:
    examples = Path(__file__).resolve().parents[2] / "examples" / "claude"
    applied = server.cli(
        "apply",
        "-f",
        str(examples / "agent.yaml"),
        "-f",
        str(examples / "byok.yaml"),
        "-f",
        str(examples / "run.yaml"),
    )
    assert applied.returncode == 0, applied.stderr
    assert "secret/anthropic-key created" in applied.stdout and "agent/byok-helper created" in applied.stdout
    secret_yaml = server.cli("get", "secret/anthropic-key", "-o", "yaml").stdout
    assert "ANTHROPIC_API_KEY" in secret_yaml and "REPLACE-ME" not in secret_yaml
    waited = server.cli(
        "wait", "agentrun/claude-helper-run", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=2m"
    )
    assert waited.returncode == 0, waited.stdout + waited.stderr
    run = json.loads(server.cli("get", "agentrun/claude-helper-run", "-o", "json").stdout)
    assert Decimal(0) < Decimal(run["status"]["cost"]["totalUSD"]) <= Decimal("0.10")
    assert run["status"]["cost"]["limitUSD"] == "0.10"
    assert "0 files" in run["status"]["answer"]["preview"]


def test_every_stop_reason_has_a_defined_outcome(server: Server, fake_anthropic: Any) -> None:
    secret, agent = unique("stops-key"), unique("stops")
    key = f"sk-ant-stops-{uuid.uuid4().hex}"
    assert (
        server.cli("create", "secret", secret, "--from-literal", f"ANTHROPIC_API_KEY={key}").returncode == 0
    )
    _agent(
        server,
        agent,
        maxTokens=64,
        model={"access": "BYOK", "name": "claude-haiku-5-5", "apiKeySecret": secret},
    )

    fake_anthropic.script(text_reply("Thinking about it...", stop_reason="pause_turn"), text_reply("Done."))
    paused = _settled(server, _run(server, agent, "long task"))
    assert (paused["status"]["phase"], paused["status"]["reason"]) == ("Succeeded", "Completed")
    assert paused["status"]["answer"]["preview"] == "Done."
    with server.http() as http:
        steps = http.get(f"{RUNS}/{paused['metadata']['name']}/steps").json()["items"]
    assert [s["kind"] for s in steps].count("model") == 2  # the paused turn was sent back and went on

    fake_anthropic.script(text_reply("A partial answ", stop_reason="max_tokens"))
    cut = _settled(server, _run(server, agent, "write an essay"))
    assert (cut["status"]["phase"], cut["status"]["reason"]) == ("Succeeded", "MaxTokensReached")
    assert cut["status"]["answer"]["preview"] == "A partial answ"
    assert cut["status"]["turns"][0]["stopReason"] == "max_tokens"

    fake_anthropic.script(text_reply("", stop_reason="refusal"))
    refused = _settled(server, _run(server, agent, "something refused"))
    assert (refused["status"]["phase"], refused["status"]["reason"]) == ("Failed", "ModelRefused")

    fake_anthropic.script(text_reply("The end", stop_reason="stop_sequence"))
    stopped = _settled(server, _run(server, agent, "until the marker"))
    assert (stopped["status"]["phase"], stopped["status"]["answer"]["preview"]) == ("Succeeded", "The end")


def test_a_run_parked_at_its_cap_stops_waiters_and_still_meets_its_deadline(
    server: Server, sdk_env: Server
) -> None:
    import nodus
    from nodus.errors import AgentRunFailed

    agent = unique("capped-deadline")
    _agent(server, agent, perRunMaxCostUSD="0.000010", model={"families": ["sonnet"]})
    with pytest.raises(AgentRunFailed) as caught:
        nodus.ClaudeAgent.from_name(agent).remote("What is 1 + 1?")
    assert caught.value.details["reason"] == "MaxCostReached"

    name = unique("parked")
    created = server.cli(
        "create", "agentrun", name, "--agent", agent, "--prompt", "What is 2 + 2?", "--deadline", "4s"
    )
    assert created.returncode == 0, created.stderr
    waited = server.cli(
        "wait", f"agentrun/{name}", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=60s"
    )
    assert waited.returncode != 0 and "MaxCostReached" in waited.stderr
    assert "timed out" not in waited.stderr  # it gave up because the run is parked, not by timing out

    def expired() -> dict[str, Any] | None:
        with server.http() as http:
            run = http.get(f"{RUNS}/{name}").json()
        return run if run["status"]["phase"] == "Failed" else None

    run = wait_for(expired, timeout=60, message="the parked run to pass its deadline")
    assert run["status"]["reason"] == "DeadlineExceeded"
    assert not workspace_of(server, name).exists()
