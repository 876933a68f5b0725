"""What a span says, decided without OpenTelemetry: settings, trace ids and attributes.

Pure functions of plain values (standard library only), so the rules are unit-tested without
the SDK and `nodus_ray.tracing` can decide whether tracing is on without importing it.

* **Settings.** Tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set in the environment of ``nodus up``; the
  ``OTEL_*`` variables are then kept in `ServerSettings.telemetry` and handed to each run
  actor with its `RunConfig`, like every other server setting (decision 57). Off, nothing is
  kept: other ``OTEL_*`` variables alone change nothing.
* **Ids.** A run's trace id is its ``metadata.uid`` (32 hex digits, 128 bits, as a trace id
  is), so every actor that ever serves the run writes into the same trace, and a user finds a
  run's trace by its uid; the root span's id is derived from the uid too, so a later actor
  (a replay after a crash, a keep-alive run's next message) hangs its span under the root
  without anything stored.
* **Attributes.** The GenAI semantic conventions for a model call (``gen_ai.*``), ours
  (``nodus.*``) for the rest. Never a prompt, a reply, command output or an environment value:
  a command's span holds its first line (already redacted), cut at `COMMAND_PREVIEW`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

__all__ = [
    "Telemetry",
    "ENDPOINT_ENV",
    "TRACES_ENDPOINT_ENV",
    "COMMAND_PREVIEW",
    "telemetry_from_env",
    "redacted_telemetry",
    "trace_id_of",
    "root_span_id_of",
    "provider_name",
    "model_request_attributes",
    "model_response_attributes",
    "command_attributes",
    "command_result_attributes",
    "run_attributes",
]

Telemetry = tuple[tuple[str, str], ...]
"""The ``OTEL_*`` variables tracing runs with, sorted; empty: tracing is off."""

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
_PROTOCOL_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_PROTOCOL = "http/protobuf"
_SECRET_ENVS = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
COMMAND_PREVIEW = 120


def _check_endpoint(name: str, value: str) -> None:
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest.strip("/"):
        raise ValueError(f"{name}={value!r} must be an http:// or https:// URL of an OTLP/HTTP receiver")


def telemetry_from_env(environ: Mapping[str, str]) -> Telemetry:
    """The ``OTEL_*`` variables to trace with, or ``()`` when tracing is off.

    On when an OTLP endpoint is set, unless ``OTEL_SDK_DISABLED=true`` or
    ``OTEL_TRACES_EXPORTER=none``. A bad value is refused here, naming the variable: an endpoint
    that is not an http(s) URL, a protocol other than ``http/protobuf`` (the one exported).
    """
    wanted = {
        key: value.strip() for key, value in environ.items() if key.startswith("OTEL_") and value.strip()
    }
    if not (wanted.get(ENDPOINT_ENV) or wanted.get(TRACES_ENDPOINT_ENV)):
        return ()
    if wanted.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return ()
    if wanted.get("OTEL_TRACES_EXPORTER", "otlp").lower() == "none":
        return ()
    for name in (ENDPOINT_ENV, TRACES_ENDPOINT_ENV):
        if name in wanted:
            _check_endpoint(name, wanted[name])
    for name in _PROTOCOL_ENVS:
        if name in wanted and wanted[name] != _PROTOCOL:
            raise ValueError(f"{name}={wanted[name]!r}: nodus exports traces over {_PROTOCOL!r} only")
    return tuple(sorted(wanted.items()))


def redacted_telemetry(telemetry: Telemetry) -> dict[str, str]:
    """The settings as they may be shown (a Conflict at ``nodus up``): header values hidden,
    since they may carry the tracing backend's token."""
    return {key: ("<redacted>" if key in _SECRET_ENVS else value) for key, value in telemetry}


def _digest(uid: str) -> bytes:
    return hashlib.sha256(f"nodus-run:{uid}".encode()).digest()


def trace_id_of(uid: str) -> int:
    """The run's trace id: its uid (32 hex digits) as is, else 128 bits of its SHA-256."""
    if len(uid) == 32:
        try:
            value = int(uid, 16)
        except ValueError:
            value = 0
        if value:
            return value
    return int.from_bytes(_digest(uid)[:16], "big") or 1


def root_span_id_of(uid: str) -> int:
    """The id of the run's root span (``nodus.run``), the same in every actor of the run."""
    return int.from_bytes(_digest(uid)[16:24], "big") or 1


def provider_name(provider: str) -> str:
    """``gen_ai.provider.name``: ``anthropic`` for Claude, ``nodus.<name>`` for ours (offline)."""
    return "anthropic" if provider == "anthropic" else f"nodus.{provider}"


def model_request_attributes(provider: str, model: str, max_tokens: int, step_id: str) -> dict[str, Any]:
    """A model call's span before it is sent (GenAI conventions: an inference ``chat`` span)."""
    system = provider_name(provider)
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": system,
        "gen_ai.system": system,  # the older name of the same, still what many backends read
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": int(max_tokens),
        "nodus.step_id": step_id,
    }


def model_response_attributes(response: Mapping[str, Any]) -> dict[str, Any]:
    """A reply's attributes, from `ModelResponse.to_dict()`: model, finish reason, tokens.

    ``gen_ai.usage.input_tokens`` counts every input token, cached ones included, as the
    conventions say (Anthropic's ``input_tokens`` leaves cache reads and writes out); the two
    cache counts are attributes of their own.
    """
    usage = response.get("usage") or {}
    fresh = int(usage.get("input_tokens") or 0)
    read = int(usage.get("cache_read_input_tokens") or 0)
    created = int(usage.get("cache_creation_input_tokens") or 0)
    out: dict[str, Any] = {
        "gen_ai.response.model": str(response.get("model") or ""),
        "gen_ai.usage.input_tokens": fresh + read + created,
        "gen_ai.usage.output_tokens": int(usage.get("output_tokens") or 0),
        "gen_ai.usage.cache_read.input_tokens": read,
        "gen_ai.usage.cache_creation.input_tokens": created,
    }
    if response.get("stop_reason"):
        out["gen_ai.response.finish_reasons"] = [str(response["stop_reason"])]
    if response.get("id"):
        out["gen_ai.response.id"] = str(response["id"])
    if int(response.get("attempts") or 1) > 1:
        out["nodus.model.attempts"] = int(response["attempts"])
    return out


def command_attributes(command: str, step_id: str) -> dict[str, Any]:
    """A command's span: its first line (redacted by the caller), cut short; never its env."""
    lines = command.strip().splitlines() or [""]
    first = lines[0]
    if len(first) > COMMAND_PREVIEW:
        first = first[: COMMAND_PREVIEW - 3] + "..."
    elif len(lines) > 1:
        first += " ..."
    return {"nodus.command": first, "nodus.command.lines": len(lines), "nodus.step_id": step_id}


def command_result_attributes(result: Mapping[str, Any]) -> dict[str, Any]:
    """From `CommandResult.to_dict()`: exit code (none when it was killed), the limit that
    stopped it, its CPU; not the output."""
    out: dict[str, Any] = {"nodus.command.cpu_seconds": float(result.get("cpu_seconds") or 0.0)}
    if result.get("exit_code") is not None:
        out["process.exit.code"] = int(result["exit_code"])
    if result.get("limit"):
        out["nodus.command.limit"] = str(result["limit"])
    if result.get("timed_out"):
        out["nodus.command.timed_out"] = True
    if result.get("cancelled"):
        out["nodus.command.cancelled"] = True
    if result.get("truncated"):
        out["nodus.command.output_truncated"] = True
    return out


def run_attributes(
    *,
    project: str,
    name: str,
    uid: str,
    agent: str,
    agent_revision: int,
    group: str | None,
    attempt: int,
    generation: int,
    kind: str,
) -> dict[str, Any]:
    """The run's span: which run, of which agent and group, served by which attempt."""
    out: dict[str, Any] = {
        "nodus.project": project,
        "nodus.run.name": name,
        "nodus.run.uid": uid,
        "nodus.agent": agent,
        "nodus.agent.revision": agent_revision,
        "nodus.run.attempt": attempt,
        "nodus.run.kind": kind,
    }
    if group:
        out["nodus.group"] = group
    if generation:
        out["nodus.run.generation"] = generation
    return out
