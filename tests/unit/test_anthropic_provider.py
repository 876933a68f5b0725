"""The Anthropic provider through the real ``anthropic`` SDK, against a local fake Messages API.

No Ray and no network: ``FakeMessagesAPI`` listens on 127.0.0.1 and speaks the API (SSE streams,
error bodies, retry headers), so these tests check what actually goes over the wire (the request,
its cache breakpoints, its key), how answers, usage and stop reasons come back, and how failures
become ``ModelError`` reasons without retry storms or leaked keys. Retries are made fast with
``retry-after-ms`` headers, which the SDK honours.
"""

from __future__ import annotations

import copy
import pickle
import socket
import threading
from typing import Any

import pytest

from nodus_ray.models.anthropic_provider import DEFAULT_FAMILY_MODELS, AnthropicProvider
from nodus_ray.models.base import BASH_TOOL, ModelError, ModelProvider, ModelRequest
from tests.fakes.anthropic_api import (
    FakeMessagesAPI,
    cut_stream_reply,
    error_reply,
    reply,
    stream_error_reply,
    text_reply,
    tool_use_reply,
)

KEY = "sk-ant-api03-unit-test-key-0123456789abcdef"
MODEL = "claude-sonnet-5-5"
FAST = {"retry-after-ms": "1"}  # the SDK waits 1 ms instead of its 0.5 s back-off
EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy may stand between the SDK and 127.0.0.1, and no ambient key may be used."""
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "ANTHROPIC_BASE_URL",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def api() -> Any:
    with FakeMessagesAPI() as fake:
        yield fake


def _provider(api: FakeMessagesAPI, **kwargs: Any) -> AnthropicProvider:
    kwargs.setdefault("timeout_seconds", 10.0)
    return AnthropicProvider(api_key=KEY, base_url=api.base_url, **kwargs)


def _request(
    messages: list[dict[str, Any]] | None = None,
    *,
    system: str = "Be brief.",
    tools: list[dict[str, Any]] | None = None,
    max_tokens: int = 512,
) -> ModelRequest:
    return ModelRequest(
        model=MODEL,
        system=system,
        messages=messages if messages is not None else [{"role": "user", "content": "hello"}],
        max_tokens=max_tokens,
        tools=tools if tools is not None else [BASH_TOOL],
    )


def _conversation() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "list the files"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "exit code 0\na.txt"},
            ],
        },
    ]


def _breakpoints(body: dict[str, Any]) -> int:
    count = sum("cache_control" in tool for tool in body.get("tools", []))
    count += sum("cache_control" in block for block in body.get("system", []) if isinstance(block, dict))
    for message in body["messages"]:
        if isinstance(message["content"], list):
            count += sum("cache_control" in block for block in message["content"])
    return count


# ------------------------------------------------------------------------------------------------
# What is sent


def test_the_request_on_the_wire(api: FakeMessagesAPI) -> None:
    other_tool = {"name": "noop", "description": "does nothing", "input_schema": {"type": "object"}}
    messages = _conversation()
    before = copy.deepcopy(messages)
    tools = [other_tool, BASH_TOOL]
    tools_before = copy.deepcopy(tools)
    api.script(text_reply("two files"))

    response = _provider(api).complete(_request(messages, tools=tools, max_tokens=777))

    assert response.text() == "two files"
    [sent] = api.requests
    assert sent.method == "POST" and sent.path == "/v1/messages"
    body = sent.body
    assert body["model"] == MODEL
    assert body["max_tokens"] == 777
    assert body["stream"] is True
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}]
    assert body["tools"] == [other_tool, {**BASH_TOOL, "cache_control": EPHEMERAL}]
    # The breakpoint sits on the last block of the last user message; everything else is as given.
    assert body["messages"][:2] == before[:2]
    assert body["messages"][2]["content"] == [{**before[2]["content"][0], "cache_control": EPHEMERAL}]
    assert _breakpoints(body) == 3
    # The caller's data is untouched.
    assert messages == before and tools == tools_before and BASH_TOOL.get("cache_control") is None
    # The key and the API version travel as headers (SDK 2.x sends api_key= as a Bearer token).
    assert sent.api_key == KEY
    assert sent.headers.get("x-api-key") == KEY or sent.headers.get("authorization") == f"Bearer {KEY}"
    assert sent.headers.get("anthropic-version")


def test_a_string_user_message_becomes_a_text_block_to_carry_the_breakpoint(api: FakeMessagesAPI) -> None:
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "pre-filled"},
    ]
    before = copy.deepcopy(messages)
    _provider(api).complete(_request(messages))
    sent = api.requests[0].body["messages"]
    assert sent[0] == before[0]
    assert sent[2] == {
        "role": "user",
        "content": [{"type": "text", "text": "second", "cache_control": EPHEMERAL}],
    }
    assert sent[3] == before[3]  # the last message is the assistant's: the breakpoint is on the last user one
    assert messages == before


def test_one_message_gets_no_breakpoint_and_an_empty_system_is_omitted(api: FakeMessagesAPI) -> None:
    _provider(api).complete(_request([{"role": "user", "content": "hi"}], system=""))
    body = api.requests[0].body
    assert "system" not in body
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["tools"][-1]["cache_control"] == EPHEMERAL
    assert _breakpoints(body) == 1


def test_no_tools_means_no_tools_parameter(api: FakeMessagesAPI) -> None:
    _provider(api).complete(_request(tools=[]))
    body = api.requests[0].body
    assert "tools" not in body
    assert _breakpoints(body) == 1  # the system prompt


def test_at_most_four_breakpoints_dropping_the_callers_oldest(api: FakeMessagesAPI) -> None:
    def marked(text: str) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "text", "text": text, "cache_control": EPHEMERAL}]}

    messages = [
        marked("one"),
        {"role": "assistant", "content": "a"},
        marked("two"),
        {"role": "assistant", "content": "b"},
        marked("three"),
        {"role": "assistant", "content": "c"},
        {"role": "user", "content": "four"},
    ]
    before = copy.deepcopy(messages)
    _provider(api).complete(_request(messages))  # the fake refuses more than 4, as the API does
    body = api.requests[0].body
    assert _breakpoints(body) == 4
    kept = [
        m["content"][0]["text"]
        for m in body["messages"]
        if isinstance(m["content"], list) and "cache_control" in m["content"][0]
    ]
    assert kept == ["three", "four"]  # tools + system + the newest of the caller's + ours
    assert messages == before


# ------------------------------------------------------------------------------------------------
# What comes back


def test_a_tool_use_reply(api: FakeMessagesAPI) -> None:
    api.script(tool_use_reply("ls -la /tmp", text="Let me look.", tool_id="toolu_abc"))
    response = _provider(api).complete(_request())
    assert response.stop_reason == "tool_use"
    assert response.content == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_abc", "name": "bash", "input": {"command": "ls -la /tmp"}},
    ]
    assert response.tool_uses()[0]["input"] == {"command": "ls -la /tmp"}
    assert response.attempts == 1
    assert response.model == MODEL  # the model the API named (the fake echoes the request's)


def test_structured_tool_input_and_other_block_types_survive(api: FakeMessagesAPI) -> None:
    thinking = {"type": "thinking", "thinking": "The user wants files.", "signature": "sig-123"}
    tool = {
        "type": "tool_use",
        "id": "toolu_x",
        "name": "bash",
        "input": {"command": "echo 'hi \"there\"' && ls", "nested": {"n": [1, 2, {"k": None}]}},
    }
    api.script(reply([thinking, tool], "tool_use", model="claude-sonnet-5-5-20270101"))
    response = _provider(api).complete(_request())
    assert response.content == [thinking, tool]
    assert response.model == "claude-sonnet-5-5-20270101"


def test_usage_with_cache_tokens(api: FakeMessagesAPI) -> None:
    api.script(
        text_reply(
            "ok",
            usage={
                "input_tokens": 12,
                "output_tokens": 34,
                "cache_creation_input_tokens": 5600,
                "cache_read_input_tokens": 7800,
            },
        )
    )
    usage = _provider(api).complete(_request()).usage
    assert usage.to_dict() == {
        "input_tokens": 12,
        "output_tokens": 34,
        "cache_creation_input_tokens": 5600,
        "cache_read_input_tokens": 7800,
    }


def test_default_usage_is_deterministic(api: FakeMessagesAPI) -> None:
    usage = _provider(api).complete(_request()).usage
    assert usage.to_dict() == {
        "input_tokens": 100,
        "output_tokens": 20,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


@pytest.mark.parametrize(
    "stop_reason",
    [
        "end_turn",
        "tool_use",
        "max_tokens",
        "stop_sequence",
        "pause_turn",
        "refusal",
        "model_context_window_exceeded",
    ],
)
def test_stop_reasons_pass_through(api: FakeMessagesAPI, stop_reason: str) -> None:
    api.script(text_reply("x", stop_reason=stop_reason))
    assert _provider(api).complete(_request()).stop_reason == stop_reason


def test_a_missing_stop_reason_is_end_turn(api: FakeMessagesAPI) -> None:
    api.script(text_reply("x", stop_reason=None))
    assert _provider(api).complete(_request()).stop_reason == "end_turn"


def test_the_default_responder_echoes_and_a_responder_answers_anything(api: FakeMessagesAPI) -> None:
    provider = _provider(api)
    assert provider.complete(_request([{"role": "user", "content": "ping"}])).text() == "Echo: ping"
    api.set_responder(lambda body: text_reply(f"{len(body['messages'])} messages"))
    assert provider.complete(_request(_conversation())).text() == "3 messages"
    api.script(text_reply("scripted first"))
    assert provider.complete(_request()).text() == "scripted first"
    assert provider.complete(_request()).text() == "1 messages"


# ------------------------------------------------------------------------------------------------
# Retries and attempts


def test_429_with_retry_after_zero_then_success(api: FakeMessagesAPI) -> None:
    api.script(
        error_reply(
            429,
            "rate_limit_error",
            "Number of requests has exceeded your rate limit",
            headers={"retry-after": "0"},
        ),
        text_reply("after the limit"),
    )
    response = _provider(api, max_retries=2).complete(_request())
    assert response.text() == "after the limit"
    assert response.attempts == 2
    assert len(api.requests) == 2
    assert [r.headers.get("x-stainless-retry-count") for r in api.requests] == ["0", "1"]


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(500, "api_error"), (529, "overloaded_error"), (503, "api_error"), (408, "timeout_error")],
)
def test_a_transient_status_then_success(api: FakeMessagesAPI, status: int, error_type: str) -> None:
    api.script(error_reply(status, error_type, "try again", headers=FAST), text_reply("fine now"))
    response = _provider(api).complete(_request())
    assert response.text() == "fine now"
    assert response.attempts == 2
    assert len(api.requests) == 2


@pytest.mark.parametrize(
    ("status", "error_type"), [(500, "api_error"), (529, "overloaded_error"), (429, "rate_limit_error")]
)
def test_retries_exhausted_is_model_unavailable(api: FakeMessagesAPI, status: int, error_type: str) -> None:
    max_retries = 3
    api.script(
        *[error_reply(status, error_type, "still failing", headers=FAST)] * (max_retries + 1),
        text_reply("too late"),
    )
    with pytest.raises(ModelError) as caught:
        _provider(api, max_retries=max_retries).complete(_request())
    assert caught.value.reason == "ModelUnavailable"
    assert caught.value.retryable is True
    assert f"{status} {error_type}" in str(caught.value) and "still failing" in str(caught.value)
    assert len(api.requests) == max_retries + 1
    assert api.pending == 1  # the provider did not retry on top of the SDK


def test_a_cut_stream_is_retried_and_counted(api: FakeMessagesAPI) -> None:
    api.script(cut_stream_reply("half an answ"), text_reply("a whole answer"))
    response = _provider(api).complete(_request())
    assert response.text() == "a whole answer"
    assert response.attempts == 2
    assert len(api.requests) == 2


def test_a_stream_ending_cleanly_without_message_stop_is_retried(api: FakeMessagesAPI) -> None:
    api.script(cut_stream_reply("half", clean_eof=True), text_reply("whole"))
    response = _provider(api).complete(_request())
    assert (response.text(), response.attempts) == ("whole", 2)


def test_an_overloaded_error_event_inside_the_stream_is_retried(api: FakeMessagesAPI) -> None:
    api.script(stream_error_reply("overloaded_error", "Overloaded", text="partial"), text_reply("recovered"))
    response = _provider(api).complete(_request())
    assert (response.text(), response.attempts) == ("recovered", 2)


def test_attempts_add_the_sdk_retries_and_the_stream_retries(api: FakeMessagesAPI) -> None:
    api.script(
        error_reply(529, "overloaded_error", "Overloaded", headers=FAST),  # SDK retry
        cut_stream_reply("cut"),  # provider's stream retry
        error_reply(500, "api_error", "oops", headers=FAST),  # SDK retry
        error_reply(429, "rate_limit_error", "slow", headers=FAST),  # SDK retry
        text_reply("finally"),
    )
    response = _provider(api).complete(_request())
    assert response.text() == "finally"
    assert response.attempts == 5 == len(api.requests)


def test_a_stream_cut_every_time_is_model_unavailable(api: FakeMessagesAPI) -> None:
    api.script(*[cut_stream_reply("never finishes")] * 3, text_reply("unused"))
    with pytest.raises(ModelError) as caught:
        _provider(api, stream_retries=2).complete(_request())
    assert caught.value.reason == "ModelUnavailable"
    assert caught.value.retryable is True
    assert "stream" in str(caught.value)
    assert len(api.requests) == 3
    assert api.pending == 1


def test_no_stream_retries_means_one_stream(api: FakeMessagesAPI) -> None:
    api.script(cut_stream_reply("cut"), text_reply("unused"))
    with pytest.raises(ModelError) as caught:
        _provider(api, stream_retries=0).complete(_request())
    assert caught.value.reason == "ModelUnavailable"
    assert len(api.requests) == 1


def test_an_unreachable_api_is_model_unavailable() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider = AnthropicProvider(
        api_key=KEY, base_url=f"http://127.0.0.1:{port}", max_retries=0, timeout_seconds=5.0
    )
    with pytest.raises(ModelError) as caught:
        provider.complete(_request())
    assert caught.value.reason == "ModelUnavailable"
    assert caught.value.retryable is True
    assert KEY not in str(caught.value)


# ------------------------------------------------------------------------------------------------
# Failures that must not be retried


def test_a_refused_key_fails_once_without_retries(api: FakeMessagesAPI) -> None:
    api.accept_keys({"sk-ant-some-other-key"})
    api.script(text_reply("never served"))
    with pytest.raises(ModelError) as caught:
        _provider(api, max_retries=4, stream_retries=2).complete(_request())
    error = caught.value
    assert error.reason == "ModelAuthenticationFailed"
    assert error.retryable is False
    assert str(error) == "the Anthropic API refused the key (401 authentication_error)"
    assert len(api.requests) == 1  # no retry storm: neither the SDK nor the provider tried again
    assert api.pending == 1
    assert error.__cause__ is None and error.__context__ is None  # nothing holding the request's headers


def test_a_forbidden_key_fails_once(api: FakeMessagesAPI) -> None:
    api.script(error_reply(403, "permission_error", "Your API key does not have permission"))
    with pytest.raises(ModelError) as caught:
        _provider(api).complete(_request())
    assert caught.value.reason == "ModelAuthenticationFailed"
    assert str(caught.value) == "the Anthropic API refused the key (403 permission_error)"
    assert len(api.requests) == 1


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "invalid_request_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),
    ],
)
def test_a_refused_request_is_model_request_invalid(
    api: FakeMessagesAPI, status: int, error_type: str
) -> None:
    api.script(error_reply(status, error_type, "model: claude-nope is not a model"))
    with pytest.raises(ModelError) as caught:
        _provider(api).complete(_request())
    assert caught.value.reason == "ModelRequestInvalid"
    assert caught.value.retryable is False
    assert "model: claude-nope is not a model" in str(caught.value)
    assert f"{status} {error_type}" in str(caught.value)
    assert len(api.requests) == 1


def test_an_invalid_request_error_event_in_the_stream_is_not_retried(api: FakeMessagesAPI) -> None:
    api.script(stream_error_reply("invalid_request_error", "prompt is too long"), text_reply("unused"))
    with pytest.raises(ModelError) as caught:
        _provider(api).complete(_request())
    assert caught.value.reason == "ModelRequestInvalid"
    assert "prompt is too long" in str(caught.value)
    assert len(api.requests) == 1


# ------------------------------------------------------------------------------------------------
# The key stays secret


def test_the_key_never_appears_in_errors_or_repr(api: FakeMessagesAPI) -> None:
    provider = _provider(api)
    assert KEY not in repr(provider) and "sk-ant" not in repr(provider)
    echoes = [
        f"invalid key {KEY}",
        f"headers: {{'x-api-key': '{KEY}', 'authorization': 'Bearer {KEY}'}}",
        "x-api-key: sk-ant-api03-someone-elses-key-xyz",
        "Authorization: Bearer abcdefghijklmnopqrstuvwxyz123456",
    ]
    for status, error_type in [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (500, "api_error"),
        (418, "teapot_error"),
    ]:
        for echo in echoes:
            api.script(*[error_reply(status, error_type, echo, headers=FAST)] * 5)
            with pytest.raises(ModelError) as caught:
                _provider(api, max_retries=0).complete(_request())
            text = str(caught.value)
            assert KEY not in text and "sk-ant" not in text and "abcdefghijklmnop" not in text, text
            api.reset()
    # an unknown status is a plain ModelError
    api.script(error_reply(418, "teapot_error", "short and stout"))
    with pytest.raises(ModelError) as caught:
        provider.complete(_request())
    assert caught.value.reason == "ModelError" and "short and stout" in str(caught.value)


def test_the_key_is_stripped_and_explicit_keys_win_over_the_environment(
    api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-the-environment")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "token-from-the-environment")
    AnthropicProvider(api_key=f"  {KEY}\n", base_url=api.base_url).complete(_request())
    sent = api.requests[0]
    assert sent.api_key == KEY
    assert "environment" not in str(sent.headers)


def test_base_url_from_the_environment_when_not_given(
    api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.base_url)
    assert AnthropicProvider(api_key=KEY).complete(_request()).text() == "Echo: hello"
    assert len(api.requests) == 1


# ------------------------------------------------------------------------------------------------
# The rest of the interface


def test_model_for_family() -> None:
    provider = AnthropicProvider(api_key=KEY, family_models={"opus": "claude-opus-5-5-20270301"})
    assert isinstance(provider, ModelProvider)
    assert provider.name == "anthropic"
    assert provider.model_for_family("haiku") == DEFAULT_FAMILY_MODELS["haiku"] == "claude-haiku-5-5"
    assert provider.model_for_family(" Sonnet ") == "claude-sonnet-5-5"
    assert provider.model_for_family("fable") == "claude-fable-5-5"
    assert provider.model_for_family("opus") == "claude-opus-5-5-20270301"
    assert provider.model_for_family("claude-sonnet-5-5") == "claude-sonnet-5-5"
    with pytest.raises(ValueError, match="unknown model family"):
        provider.model_for_family("gpt")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"api_key": ""},
        {"api_key": "  \n"},
        {"api_key": KEY, "max_retries": -1},
        {"api_key": KEY, "stream_retries": -1},
        {"api_key": KEY, "timeout_seconds": 0},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        AnthropicProvider(**kwargs)


def test_a_pickled_provider_works(api: FakeMessagesAPI) -> None:
    provider = _provider(api)
    provider.complete(_request())
    clone = pickle.loads(pickle.dumps(provider))
    assert clone.complete(_request()).text() == "Echo: hello"
    provider.close()


def test_concurrent_calls_share_one_provider(api: FakeMessagesAPI) -> None:
    provider = _provider(api)
    results: dict[int, str] = {}

    def call(n: int) -> None:
        results[n] = provider.complete(_request([{"role": "user", "content": f"n={n}"}])).text()

    threads = [threading.Thread(target=call, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert results == {n: f"Echo: n={n}" for n in range(8)}
    assert len(api.requests) == 8


# ------------------------------------------------------------------------------------------------
# The fake itself, as integration tests use it


def test_a_failing_responder_is_reported_not_retried(api: FakeMessagesAPI) -> None:
    def broken(body: dict[str, Any]) -> Any:
        raise KeyError("no such thing")

    api.set_responder(broken)
    with pytest.raises(ModelError) as caught:
        _provider(api).complete(_request())
    assert "responder failed" in str(caught.value)
    assert len(api.requests) == 1
    assert isinstance(api.responder_errors[0], KeyError)


def test_the_fake_also_answers_without_streaming_and_counts_tokens(api: FakeMessagesAPI) -> None:
    import anthropic

    client = anthropic.Anthropic(api_key=KEY, base_url=api.base_url, max_retries=0)
    api.script(tool_use_reply("pwd"))
    message = client.messages.create(
        model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "where"}]
    )
    assert message.stop_reason == "tool_use"
    assert message.content[0].input == {"command": "pwd"}
    assert message.content[0].id.startswith("toolu_fake_")
    count = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "x" * 400}])
    assert count.input_tokens > 0
    assert [r.path for r in api.requests] == ["/v1/messages", "/v1/messages/count_tokens"]
    assert len(api.message_requests()) == 1
    client.close()
