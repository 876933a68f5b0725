"""A run's trace, as an OTLP backend receives it from the session's real service.

The session's `nodus up` has ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at a receiver in this
process (`conftest.otlp_receiver`, `tests.fakes.otlp_receiver`): every run actor exports its
spans over OTLP/HTTP. One Claude run (the real anthropic SDK, on the user's own key, against
the fake Messages API) runs a command; its trace must be the tree run -> turn -> model calls
and command, with the GenAI attributes, and hold no secret, prompt or reply.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from nodus_ray.tracing.attributes import root_span_id_of
from tests.fakes.anthropic_api import text_reply, tool_use_reply
from tests.fakes.otlp_receiver import OtlpReceiver, ReceivedSpan

from .conftest import Server, unique, wait_for

AGENTS = "/v1/projects/default/agents"
RUNS = "/v1/projects/default/agentruns"


def _complete(spans: list[ReceivedSpan]) -> bool:
    names = [span.name for span in spans]
    return "nodus.run" in names and names.count("chat claude-sonnet-5-5") == 2 and "nodus.command" in names


def test_one_runs_trace_is_its_tree_with_genai_attributes_and_no_secrets(
    server: Server, fake_anthropic: Any, otlp_receiver: OtlpReceiver
) -> None:
    key = f"sk-ant-traced-{uuid.uuid4().hex}"
    secret, agent, name = unique("traced-key"), unique("traced"), unique("traced-run")
    created = server.cli("create", "secret", secret, "--from-literal", f"ANTHROPIC_API_KEY={key}")
    assert created.returncode == 0, created.stderr
    marker = f"trace-{uuid.uuid4().hex[:8]}"
    fake_anthropic.script(
        tool_use_reply("echo hi\necho second line", usage={"input_tokens": 120, "output_tokens": 30}),
        text_reply(
            f"It printed hi ({marker}-reply).",
            usage={"input_tokens": 160, "output_tokens": 10, "cache_read_input_tokens": 40},
        ),
    )
    with server.http() as http:
        response = http.put(
            f"{AGENTS}/{agent}",
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "Agent",
                "metadata": {"name": agent},
                "spec": {
                    "system": "You are careful.",
                    "maxTokens": 777,
                    "model": {"access": "BYOK", "name": "claude-sonnet-5-5", "apiKeySecret": secret},
                },
            },
        )
        assert response.status_code in (200, 201), response.text
        response = http.post(
            RUNS,
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "AgentRun",
                "metadata": {"name": name},
                "spec": {"agent": agent, "input": f"{marker}: use the shell to print hi"},
            },
        )
        assert response.status_code == 201, response.text

    def succeeded() -> dict[str, Any] | None:
        with server.http() as http:
            run: dict[str, Any] = http.get(f"{RUNS}/{name}").json()
        return run if run["status"]["phase"] in ("Succeeded", "Failed") else None

    run = wait_for(succeeded, timeout=120, message=f"run {name} to end")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    uid = run["metadata"]["uid"]

    # The run's trace id is its uid: every span of the run is in that one trace.
    spans = otlp_receiver.wait_for(_complete, trace_id=uid, timeout=60)
    by_id = {span.span_id: span for span in spans}
    assert len(by_id) == len(spans), "a span was received twice"

    (root,) = [span for span in spans if span.name == "nodus.run"]
    assert root.parent_span_id == "" and root.span_id == f"{root_span_id_of(uid):016x}"
    assert root.attributes["nodus.project"] == "default"
    assert root.attributes["nodus.run.name"] == name
    assert root.attributes["nodus.run.uid"] == uid
    assert root.attributes["nodus.agent"] == agent
    assert root.attributes["nodus.run.attempt"] == 1
    assert root.attributes["nodus.run.kind"] == "claude"
    assert (root.attributes["nodus.run.phase"], root.attributes["nodus.run.reason"]) == (
        "Succeeded",
        "Completed",
    )
    assert root.resource["service.name"] == "nodus"

    # Every other span hangs in the tree under the root.
    for span in spans:
        if span is not root:
            assert span.parent_span_id in by_id, f"{span.name} has a parent outside the trace"
            assert root.start_ns <= span.start_ns <= span.end_ns <= root.end_ns, span.name

    (turn,) = [span for span in spans if span.name == "nodus.turn"]
    assert turn.parent_span_id == root.span_id and turn.attributes["nodus.turn.index"] == 1

    calls = sorted((s for s in spans if s.name == "chat claude-sonnet-5-5"), key=lambda s: s.start_ns)
    assert [call.parent_span_id for call in calls] == [turn.span_id, turn.span_id]
    for call in calls:
        assert call.kind == 3  # SPAN_KIND_CLIENT
        assert call.attributes["gen_ai.operation.name"] == "chat"
        assert call.attributes["gen_ai.provider.name"] == "anthropic"
        assert call.attributes["gen_ai.system"] == "anthropic"
        assert call.attributes["gen_ai.request.model"] == "claude-sonnet-5-5"
        assert call.attributes["gen_ai.response.model"] == "claude-sonnet-5-5"
        assert call.attributes["gen_ai.request.max_tokens"] == 777
    first, second = calls
    assert first.attributes["nodus.step_id"] == "turn-1/model-1"
    assert first.attributes["gen_ai.response.finish_reasons"] == ["tool_use"]
    assert (
        first.attributes["gen_ai.usage.input_tokens"],
        first.attributes["gen_ai.usage.output_tokens"],
    ) == (120, 30)
    assert second.attributes["gen_ai.response.finish_reasons"] == ["end_turn"]
    # Cached input counts as input (the conventions' rule), and is shown on its own too.
    assert second.attributes["gen_ai.usage.input_tokens"] == 200
    assert second.attributes["gen_ai.usage.cache_read.input_tokens"] == 40
    assert second.attributes["gen_ai.usage.output_tokens"] == 10

    (command,) = [span for span in spans if span.name == "nodus.command"]
    assert command.parent_span_id == turn.span_id
    assert command.attributes["nodus.command"] == "echo hi ..."  # the first line only
    assert command.attributes["process.exit.code"] == 0
    assert command.attributes["nodus.step_id"] == "turn-1/command-1-1"
    assert first.end_ns <= command.start_ns and command.end_ns <= second.start_ns

    # Journal writes: one span per durable write, under the run or the step that wrote it.
    writes = [span for span in spans if span.name == "nodus.journal.write"]
    assert writes and all(w.attributes["nodus.journal.records"] >= 1 for w in writes)
    assert {w.parent_span_id for w in writes} <= {root.span_id, turn.span_id}
    written = {w.attributes["nodus.step_id"] for w in writes}
    assert {"sandbox", "turn-1/model-1", "turn-1/command-1-1"} <= written

    # Content capture is off: no key, no prompt, no reply in any span of the trace.
    shown = json.dumps([[s.name, s.attributes, s.resource] for s in spans])
    assert key not in shown
    assert marker not in shown
    assert "It printed hi" not in shown
