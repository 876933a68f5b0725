"""The model relay with the real anthropic SDK inside a bootstrapped program: a plain call, both
ways of streaming, a recorded API error, a wrong key, and what the actor receives."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from nodus._runtime.protocol import ErrorInfo, Outcome, Reply
from nodus._runtime.relay import sse_events
from tests.unit.test_runtime_fake_actor import FakeActor, write_program

MESSAGE: dict[str, Any] = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-haiku-4-5",
    "content": [
        {"type": "text", "text": "Label: bug. Looking it up."},
        {"type": "tool_use", "id": "toolu_01", "name": "lookup", "input": {"issue": 42, "tags": ["a", "b"]}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 21, "output_tokens": 13},
}


def model(body: dict[str, Any]) -> Reply:
    if body["messages"][0]["content"] == "please fail":
        return Reply(Outcome.RECORDED, error=ErrorInfo("rate_limit_error", "over the rate limit"))
    return Reply(Outcome.RECORDED, copy.deepcopy(MESSAGE))


PROGRAM = """
import anthropic, os


def main(ctx, input):
    client = anthropic.Anthropic()
    ask = dict(model="claude-haiku-4-5", max_tokens=64, system="You triage.",
               messages=[{"role": "user", "content": "Triage: crash"}])
    plain = client.messages.create(**ask)
    with client.messages.stream(**ask) as stream:
        pieces = list(stream.text_stream)
        streamed = stream.get_final_message()
    events = [event.type for event in client.messages.create(**ask, stream=True)]
    try:
        client.messages.create(**{**ask, "messages": [{"role": "user", "content": "please fail"}]})
        error = None
    except anthropic.RateLimitError as exc:
        error = [exc.status_code, exc.body["error"]["type"], exc.body["error"]["message"]]
    try:
        anthropic.Anthropic(api_key="not-the-placeholder").messages.create(**ask)
        wrong_key = None
    except anthropic.AuthenticationError as exc:
        wrong_key = exc.status_code
    tokens = client.messages.count_tokens(model="claude-haiku-4-5", messages=ask["messages"]).input_tokens
    return {
        "plain": plain.model_dump(exclude_none=True),
        "streamed": streamed.model_dump(exclude_none=True),
        "pieces": pieces,
        "events": events,
        "error": error,
        "wrong_key": wrong_key,
        "tokens": tokens,
        "base_url": os.environ["ANTHROPIC_BASE_URL"],
    }
"""


def _content(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in block.items() if v is not None} for block in message["content"]]


def test_the_sdk_gets_the_recorded_response_plain_and_streamed(tmp_path: Path) -> None:
    actor = FakeActor(model=model)
    try:
        start = actor.start(write_program(tmp_path, PROGRAM))
    finally:
        actor.close()
    out = start.returned
    assert isinstance(out, dict), (start.raised, start.stderr)
    for key in ("plain", "streamed"):
        assert _content(out[key]) == MESSAGE["content"], key
        assert out[key]["stop_reason"] == "tool_use" and out[key]["id"] == "msg_01"
        assert out[key]["usage"]["input_tokens"] == 21 and out[key]["usage"]["output_tokens"] == 13
    assert "".join(out["pieces"]) == "Label: bug. Looking it up."
    assert out["events"] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    # An error travels with its status and is not retried by the SDK (one ModelCall for it).
    assert out["error"] == [429, "rate_limit_error", "over the rate limit"]
    assert out["wrong_key"] == 401 and out["tokens"] > 0
    assert out["base_url"].startswith("http://127.0.0.1:")
    assert len(actor.model_bodies) == 4  # plain, stream(), create(stream=True), the error
    assert all("stream" not in body for body in actor.model_bodies)
    assert actor.model_bodies[0] == {
        "model": "claude-haiku-4-5",
        "max_tokens": 64,
        "system": "You triage.",
        "messages": [{"role": "user", "content": "Triage: crash"}],
    }
    assert [entry.id for entry in actor.journal] == ["model-1", "model-2", "model-3", "model-4"]


def test_sse_events_carry_thinking_and_whole_blocks_the_sdk_has_no_delta_for() -> None:
    message = {
        **MESSAGE,
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "redacted_thinking", "data": "xyz"},
        ],
    }
    text = sse_events(message).decode()
    assert '"type":"thinking_delta","thinking":"hmm"' in text
    assert '"type":"signature_delta","signature":"sig"' in text
    assert '"content_block":{"type":"redacted_thinking","data":"xyz"}' in text
    assert text.count("event: content_block_stop") == 2 and text.endswith('data: {"type":"message_stop"}\n\n')
