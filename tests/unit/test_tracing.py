"""Traces without a cluster: the settings, the ids, the attributes, off = nothing imported, and
the span tree the real SDK exports to a local OTLP/HTTP receiver (`tests.fakes.otlp_receiver`).

The tree tests drive `nodus_ray.tracing` in a child process: a tracer provider is for a
process's lifetime, and this one's other tests must run with tracing off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from nodus.errors import NodusError
from nodus_ray.settings import ServerSettings
from nodus_ray.tracing.attributes import (
    COMMAND_PREVIEW,
    command_attributes,
    command_result_attributes,
    model_request_attributes,
    model_response_attributes,
    redacted_telemetry,
    root_span_id_of,
    telemetry_from_env,
    trace_id_of,
)
from tests.fakes.otlp_receiver import OtlpReceiver, ReceivedSpan

ROOT = Path(__file__).resolve().parents[2]
ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"


# -- settings -------------------------------------------------------------------------------
def test_tracing_is_off_without_an_endpoint_whatever_else_is_set() -> None:
    assert telemetry_from_env({}) == ()
    assert telemetry_from_env({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}) == ()
    assert telemetry_from_env({ENDPOINT: "  "}) == ()
    assert telemetry_from_env({ENDPOINT: "http://c:4318", "OTEL_SDK_DISABLED": "true"}) == ()
    assert telemetry_from_env({ENDPOINT: "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}) == ()


def test_an_endpoint_turns_tracing_on_with_every_otel_variable_and_nothing_else() -> None:
    env = {
        ENDPOINT: "http://collector:4318",
        "OTEL_SERVICE_NAME": "evals",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer abc",
        "ANTHROPIC_API_KEY": "sk-ant-never",
        "PATH": "/bin",
    }
    telemetry = telemetry_from_env(env)
    assert dict(telemetry) == {
        ENDPOINT: "http://collector:4318",
        "OTEL_SERVICE_NAME": "evals",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer abc",
    }
    assert list(telemetry) == sorted(telemetry)  # a stable settings digest
    assert telemetry_from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/v1/traces"}) != ()
    # What `nodus up` may show (a Conflict with the running settings) hides the headers.
    assert redacted_telemetry(telemetry)["OTEL_EXPORTER_OTLP_HEADERS"] == "<redacted>"
    assert redacted_telemetry(telemetry)[ENDPOINT] == "http://collector:4318"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({ENDPOINT: "collector:4318"}, ENDPOINT),
        ({ENDPOINT: "grpc://collector:4317"}, ENDPOINT),
        ({ENDPOINT: "http://"}, ENDPOINT),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://c"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        ({ENDPOINT: "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        (
            {ENDPOINT: "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ),
    ],
)
def test_a_bad_endpoint_or_protocol_is_refused_naming_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        telemetry_from_env(env)


def test_server_settings_carry_the_telemetry_and_nodus_up_refuses_a_bad_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NODUS_STORAGE", str(tmp_path / "storage"))
    monkeypatch.setenv("NODUS_SECRET_KEY_FILE", str(tmp_path / "secret.key"))
    monkeypatch.delenv(ENDPOINT, raising=False)
    assert ServerSettings.from_env().telemetry == ()
    monkeypatch.setenv(ENDPOINT, "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-token=s3cret")
    settings = ServerSettings.from_env()
    assert dict(settings.telemetry)[ENDPOINT] == "http://127.0.0.1:4318"
    assert "s3cret" not in json.dumps(settings.describe())
    monkeypatch.setenv(ENDPOINT, "127.0.0.1:4318")
    from nodus_ray import cluster

    with pytest.raises(NodusError) as refused:
        cluster.up()  # refused before anything starts
    assert refused.value.code == "Invalid" and ENDPOINT in refused.value.message


# -- ids and attributes ---------------------------------------------------------------------
def test_a_runs_trace_id_is_its_uid_and_its_root_span_id_is_fixed() -> None:
    uid = uuid.uuid4().hex
    assert trace_id_of(uid) == int(uid, 16)
    assert root_span_id_of(uid) == root_span_id_of(uid) != root_span_id_of(uuid.uuid4().hex)
    assert 0 < root_span_id_of(uid) < 2**64
    assert 0 < trace_id_of("not-a-hex-uid") < 2**128  # any other uid: 128 bits of its hash
    assert trace_id_of("0" * 32) != 0  # never the invalid trace id


def test_model_call_attributes_follow_the_genai_conventions() -> None:
    assert model_request_attributes("anthropic", "claude-sonnet-5-5", 777, "turn-1/model-1") == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.system": "anthropic",
        "gen_ai.request.model": "claude-sonnet-5-5",
        "gen_ai.request.max_tokens": 777,
        "nodus.step_id": "turn-1/model-1",
    }
    assert model_request_attributes("offline", "m", 1, "s")["gen_ai.provider.name"] == "nodus.offline"
    reply = {
        "model": "claude-sonnet-5-5",
        "content": [{"type": "text", "text": "the reply, never an attribute"}],
        "stop_reason": "end_turn",
        "usage": {
            "input_tokens": 100,
            "output_tokens": 20,
            "cache_creation_input_tokens": 40,
            "cache_read_input_tokens": 300,
        },
        "attempts": 3,
    }
    assert model_response_attributes(reply) == {
        "gen_ai.response.model": "claude-sonnet-5-5",
        "gen_ai.response.finish_reasons": ["end_turn"],
        "gen_ai.usage.input_tokens": 440,  # every input token, cached ones too
        "gen_ai.usage.output_tokens": 20,
        "gen_ai.usage.cache_read.input_tokens": 300,
        "gen_ai.usage.cache_creation.input_tokens": 40,
        "nodus.model.attempts": 3,
    }


def test_a_command_span_holds_its_first_line_cut_short_and_never_its_output() -> None:
    assert command_attributes("ls -la", "turn-1/command-1-1") == {
        "nodus.command": "ls -la",
        "nodus.command.lines": 1,
        "nodus.step_id": "turn-1/command-1-1",
    }
    assert command_attributes("cd /x\nmake\n", "s")["nodus.command"] == "cd /x ..."
    long = command_attributes("echo " + "a" * 500, "s")["nodus.command"]
    assert len(long) == COMMAND_PREVIEW and long.endswith("...")
    result = {
        "exit_code": 2,
        "output": "the output, never an attribute",
        "truncated": False,
        "timed_out": False,
        "cancelled": False,
        "duration_seconds": 0.5,
        "limit": None,
        "cpu_seconds": 0.25,
    }
    assert command_result_attributes(result) == {"process.exit.code": 2, "nodus.command.cpu_seconds": 0.25}
    killed = {**result, "exit_code": None, "timed_out": True, "limit": "timeout"}
    assert command_result_attributes(killed) == {
        "nodus.command.cpu_seconds": 0.25,
        "nodus.command.limit": "timeout",
        "nodus.command.timed_out": True,
    }


# -- off: nothing imported ------------------------------------------------------------------
def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_off_a_runs_process_imports_nothing_of_opentelemetry() -> None:
    done = _python(
        """
        import asyncio, sys
        from types import SimpleNamespace
        import nodus_ray.runtime.run_actor, nodus_ray.runtime.conversation, nodus_ray.durable.journal
        import nodus_ray.runtime.program.server, nodus_ray.runtime.program.model_calls, nodus_ray.settings
        from nodus_ray import tracing

        async def program():
            with tracing.turn(1, replaying=False), tracing.model_call("anthropic", "m", 1, "s") as call:
                call.reply(None)
            with tracing.command("ls", "s") as command, tracing.journal_write(0, 1, "s", "Started", "log"):
                command.result(None)
            return "done"

        config = SimpleNamespace(telemetry=())
        coroutine = program()
        assert tracing.traced_run(config, coroutine) is coroutine  # untouched, not wrapped
        assert asyncio.run(coroutine) == "done" and not tracing.enabled()
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        assert loaded == [], loaded
        print("clean")
        """
    )
    assert done.returncode == 0 and "clean" in done.stdout, done.stderr


# -- on: the tree, exported ------------------------------------------------------------------
_DRIVER = """
import asyncio, sys
from types import SimpleNamespace
from nodus_ray import tracing
from nodus_ray.models.base import ModelResponse, Usage

uid, endpoint, attempt = sys.argv[1], sys.argv[2], int(sys.argv[3])
config = SimpleNamespace(
    project="p", name="r", uid=uid, agent="a", agent_revision=3, group="g", attempt=attempt,
    generation=0, agent_spec={}, telemetry=(("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),),
)

async def program():
    # Turn 1 replays whole: no span. Turn 2 began replaying and goes on live: its span opens
    # at its first live call. Turn 3 is live from its start.
    with tracing.turn(1, replaying=True):
        pass
    with tracing.turn(2, replaying=True):
        with tracing.model_call("anthropic", "claude-x", 64, "turn-2/model-1") as call:
            call.reply(ModelResponse("claude-x", [], "end_turn", Usage(5, 1)))
    with tracing.turn(3, replaying=False):
        try:
            with tracing.model_call("anthropic", "claude-x", 64, "turn-3/model-1"):
                raise RuntimeError("unavailable")
        except RuntimeError:
            pass
        await asyncio.to_thread(lambda: tracing.journal_write(7, 2, "turn-3/model-1", "Failed", "log").__enter__().__exit__(None, None, None))
    step = tracing.step("fetch", "fetch-1", "external").__enter__()
    with tracing.model_call("anthropic", "claude-x", 64, "fetch-1/model-1"):
        pass
    step.failed("ValueError")
    step.__exit__(None, None, None)
    return SimpleNamespace(phase="Failed", reason="ProgramFailed")

print(asyncio.run(tracing.traced_run(config, program())).phase)
"""


def _drive(receiver: OtlpReceiver, uid: str, attempt: int) -> list[ReceivedSpan]:
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, uid, receiver.endpoint, str(attempt)],
        cwd=ROOT,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and "Failed" in done.stdout, done.stderr
    # The run's end flushed before the process exited: everything is here already.
    return receiver.spans(uid)


def test_on_the_tree_replayed_turns_resumes_and_program_steps() -> None:
    receiver = OtlpReceiver().start()
    try:
        uid = uuid.uuid4().hex
        first = _drive(receiver, uid, 1)
        names = sorted(s.name for s in first)
        assert names == sorted(
            ["nodus.run", "nodus.turn", "nodus.turn", "chat claude-x", "chat claude-x", "chat claude-x"]
            + ["nodus.journal.write", "nodus.step"]
        ), names
        by_id = {s.span_id: s for s in first}
        (run,) = [s for s in first if s.name == "nodus.run"]
        assert run.parent_span_id == "" and run.span_id == f"{root_span_id_of(uid):016x}"
        assert run.trace_id == uid and all(s.trace_id == uid for s in first)
        assert run.attributes["nodus.group"] == "g" and run.attributes["nodus.agent.revision"] == 3
        assert run.status_code == 2  # the run Failed
        turns = {s.attributes["nodus.turn.index"]: s for s in first if s.name == "nodus.turn"}
        assert sorted(turns) == [2, 3]  # the turn that replayed whole has no span
        assert turns[2].attributes["nodus.turn.resumed"] is True
        calls = {s.attributes["nodus.step_id"]: s for s in first if s.name == "chat claude-x"}
        assert by_id[calls["turn-2/model-1"].parent_span_id] is turns[2]
        assert turns[2].start_ns <= calls["turn-2/model-1"].start_ns
        failed = calls["turn-3/model-1"]
        assert by_id[failed.parent_span_id] is turns[3]
        assert failed.status_code == 2 and failed.attributes["error.type"] == "RuntimeError"
        (write,) = [s for s in first if s.name == "nodus.journal.write"]
        assert by_id[write.parent_span_id] is turns[3]  # the thread kept its parent
        (step,) = [s for s in first if s.name == "nodus.step"]
        assert step.parent_span_id == run.span_id and step.status_code == 2
        assert by_id[calls["fetch-1/model-1"].parent_span_id] is step

        # A later actor of the run: same trace, under the first actor's root.
        later = [s for s in _drive(receiver, uid, 2) if s.span_id not in by_id]
        (resume,) = [s for s in later if s.name == "nodus.run.resume"]
        assert resume.trace_id == uid and resume.parent_span_id == run.span_id
        assert resume.attributes["nodus.run.attempt"] == 2
    finally:
        receiver.stop()
