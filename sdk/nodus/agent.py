"""Agents from Python: define, deploy, submit runs, wait for answers.

This is the client side of the product's ``nodus.agent`` module, over HTTP only. The server runs
every agent on Claude, and runs many of them at once through an `AgentGroup` (a shared concurrency
limit, one cost cap, dependencies between tasks; `Agent.map` is the one-call form). It does not
yet run user code, messages or group evaluations. Whatever a call names that the server cannot do
raises `errors.Unsupported` *before anything is sent*, because a silently dropped setting is one
the user believes in and does not get.
"""

from __future__ import annotations

import hashlib
import json
import secrets as _secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, Protocol, Self

from .client import Client
from .errors import AgentRunFailed, Conflict, Invalid, Unavailable, Unsupported, WaitTimeout
from .events import afollow_events, log_line
from .resources import (
    API_VERSION,
    TERMINAL_PHASES,
    at_cost_cap,
    awaiting_message,
    parse_resource,
)

if TYPE_CHECKING:
    from .group import AgentMap

__all__ = ["View", "Agent", "ClaudeAgent", "AgentRun", "RunContext", "claude_agent_spec"]

_LATER = "a later release builds durable Python runs"
# How long the waits keep polling through an unreachable API: runs survive a server restart, so
# a waiter should too, but not forever when the server is simply gone.
_UNAVAILABLE_GRACE = 30.0
# Poll pacing of the waits and of `Agent.map`: quick at first (most runs the user waits on right
# after submitting are short), then at most once a second so many waiters do not load the API.
_POLL_FIRST_DELAY = 0.1
_POLL_MAX_DELAY = 1.0


# -- View -------------------------------------------------------------------------------------


class View:
    """A read-only view of a JSON object: ``status.phase``, ``status.counts.succeeded``, ``get()``.

    Attribute names may be written in snake_case (``run.status.agent_revision`` reads
    ``agentRevision``, ``cost.total_usd`` reads ``totalUSD``) so Python code reads naturally while
    the wire stays camelCase. Nested objects become Views; lists are lists of Views. Keys that
    clash with a method (``get``, ``to_dict``) stay reachable with ``view["get"]``.
    """

    __slots__ = ("_data",)
    __hash__ = None  # type: ignore[assignment]  # mutable underneath, like the dict it wraps

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        object.__setattr__(self, "_data", dict(data or {}))

    @staticmethod
    def wrap(value: Any) -> Any:
        """Views for mappings, lists of wrapped values for lists, everything else unchanged."""
        if isinstance(value, View):
            return value
        if isinstance(value, Mapping):
            return View(value)
        if isinstance(value, list):
            return [View.wrap(item) for item in value]
        return value

    def _key(self, name: str) -> str | None:
        if name in self._data:
            return name
        wanted = name.replace("_", "").lower()
        matches = [key for key in self._data if key.replace("_", "").lower() == wanted]
        return matches[0] if len(matches) == 1 else None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # keeps copy/pickle protocols from recursing into the data
            raise AttributeError(name)
        key = self._key(name)
        if key is None:
            known = ", ".join(sorted(self._data)) or "none"
            raise AttributeError(f"no field {name!r} (fields: {known})")
        return View.wrap(self._data[key])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a View is read-only; change the resource through the API")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("a View is read-only")

    def __getitem__(self, key: str) -> Any:
        return View.wrap(self._data[key])

    def get(self, key: str, default: Any = None) -> Any:
        """The field's value (exact key first, then its snake_case spelling), else ``default``."""
        found = self._key(key)
        return default if found is None else View.wrap(self._data[found])

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> Iterable[str]:
        return self._data.keys()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, View):
            return self._data == other._data
        if isinstance(other, Mapping):
            return self._data == dict(other)
        return NotImplemented

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {k for k in self._data if k.isidentifier()})

    def __reduce__(self) -> tuple[Any, ...]:
        return (View, (self._data,))

    def to_dict(self) -> dict[str, Any]:
        """A deep copy as plain dicts and lists, e.g. for ``json.dumps``."""
        return json.loads(json.dumps(self._data))

    def __repr__(self) -> str:
        return f"View({self._data!r})"


# -- helpers ----------------------------------------------------------------------------------


def _usd(value: Any, arg: str) -> str | None:
    """A dollar amount as the decimal string the API wants; floats go through repr (0.1 -> "0.1")."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise Invalid(f'{arg} must be an amount such as "0.50", not a bool', details={"field": arg})
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, float):
        return format(Decimal(repr(value)), "f")
    if isinstance(value, (int, Decimal)):
        return format(Decimal(value), "f")
    raise Invalid(f'{arg} must be a str, Decimal, int or float amount such as "0.50"', details={"field": arg})


def _encode_input(value: Any) -> str:
    """Run input is text; anything else travels JSON-encoded so the agent can read it back."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise Invalid(
            f"input is not a str and cannot be JSON-encoded: {exc}", details={"field": "spec.input"}
        ) from None


def _format_deadline(value: str | timedelta | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, timedelta):
        seconds = int(value.total_seconds())
        if seconds <= 0:
            raise Invalid("deadline must be more than 0s", details={"field": "spec.deadline"})
        hours, rest = divmod(seconds, 3600)
        minutes, seconds = divmod(rest, 60)
        return "".join(f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (seconds, "s")) if n)
    raise Invalid(
        'deadline must be a duration such as "2h" or a timedelta', details={"field": "spec.deadline"}
    )


def _run_name(agent: str, suffix: str, limit: int = 63) -> str:
    """``<agent>-<suffix>`` cut to ``limit`` characters (a DNS label), keeping the whole suffix."""
    prefix = agent[: limit - 1 - len(suffix)].rstrip("-")
    return f"{prefix}-{suffix}"


def _unsupported(what: str, why: str, field: str) -> Unsupported:
    return Unsupported(f"{what} is not supported yet: {why}", details={"field": field})


def _run_failed(name: str, status: Mapping[str, Any]) -> AgentRunFailed:
    """The error of a run that ended without succeeding (or is parked at its cost cap)."""
    phase = status.get("phase") or "Pending"
    reason, message = status.get("reason"), status.get("message")
    text = f"agentrun/{name} ended {phase}"
    if reason:
        text += f" ({reason})"
    if message:
        text += f": {message}"
    return AgentRunFailed(text, details={"name": name, "phase": phase, "reason": reason, "message": message})


# -- Agent ------------------------------------------------------------------------------------


class Agent:
    """A durable agent definition; deploy it, then submit runs with `remote`, `submit` or `map`.

    The server runs every agent on Claude, so only ``image`` and ``per_run_max_cost`` of the
    durable-Python definition are served; naming any other setting raises `errors.Unsupported`
    here, at construction. `ClaudeAgent` defines the system prompt and model.
    """

    # Settings of a durable-Python agent that the server cannot run yet.
    _UNSUPPORTED_ARGS: tuple[str, ...] = (
        "source",
        "entrypoint",
        "setup",
        "secrets",
        "env",
        "network",
        "models",
        "min_workers",
        "max_workers",
        "scaledown_window",
        "max_cost",
        "cpu",
        "memory",
        "app",
    )

    name: str

    def __init__(
        self,
        name: str,
        *,
        image: Any = None,
        source: str | Path | dict[str, Any] | None = None,
        entrypoint: str | None = None,
        setup: str | None = None,
        secrets: list[Any] | None = None,
        env: dict[str, str] | None = None,
        network: Any = None,
        models: list[str] | None = None,
        min_workers: int | None = None,
        max_workers: int | None = None,
        scaledown_window: Any = None,
        per_run_max_cost: Any = None,
        max_cost: Any = None,
        cpu: Any = None,
        memory: Any = None,
        app: Any = None,
        project: str | None = None,
        client: Client | None = None,
    ) -> None:
        given = locals()
        for arg in self._UNSUPPORTED_ARGS:
            if given[arg] is not None:
                raise _unsupported(
                    f"Agent({arg}=...)",
                    "runs execute on Claude, not as your code; use nodus.ClaudeAgent, or leave it out",
                    arg,
                )
        if image is not None and not isinstance(image, str):
            raise Unsupported(
                "Agent(image=...) takes an image reference string for now", details={"field": "image"}
            )
        spec: dict[str, Any] = {}
        if image is not None:
            spec["image"] = image
        cost = _usd(per_run_max_cost, "per_run_max_cost")
        if cost is not None:
            spec["perRunMaxCostUSD"] = cost
        self._setup(name, spec, project, client)

    def _setup(
        self,
        name: str,
        spec: dict[str, Any],
        project: str | None,
        client: Client | None,
        *,
        validate: bool = True,
    ) -> None:
        manifest = {"apiVersion": API_VERSION, "kind": "Agent", "metadata": {"name": name}, "spec": spec}
        if validate:  # refuse a bad definition here, before anything is sent
            parse_resource(manifest)
        self.name = name
        self._manifest = manifest
        self._project = project
        self._client = client
        self._deployed = False
        self._lock = threading.Lock()

    @classmethod
    def from_name(cls, name: str, project: str | None = None, *, client: Client | None = None) -> Self:
        """A deployed Agent, submitted to without redeploying it; raises `errors.NotFound`."""
        client = client or Client(project=project)
        resource = client.get("agents", name, project=project)
        agent = cls.__new__(cls)
        # The server's spec is taken as is: a newer server may hold fields this SDK does not know.
        Agent._setup(agent, name, dict(resource.get("spec") or {}), project, client, validate=False)
        agent._deployed = True
        return agent

    @property
    def project(self) -> str:
        return self._project or self.client.project

    @property
    def client(self) -> Client:
        """The HTTP client, created from the environment on first use."""
        if self._client is None:
            self._client = Client(project=self._project)
        return self._client

    def deploy(self) -> View:
        """Create or update the Agent; every accepted change is a new revision, and new runs pin it."""
        applied = self.client.apply("agents", self._manifest, project=self._project)
        self._deployed = True
        return View(applied.resource)

    def _ensure_deployed(self) -> None:
        with self._lock:
            if not self._deployed:
                self.deploy()

    def submit(
        self,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        session_key: str | None = None,
        deadline: str | timedelta | None = None,
        group: str | None = None,
        hold_worker: str | None = None,
        name: str | None = None,
        keep_alive: bool = False,
    ) -> AgentRun:
        """Start a run and return its handle; deploys the agent first if `deploy` was not called.

        A ``name`` (or an ``idempotency_key``, from which the name is derived) makes redelivery
        idempotent: when that run exists already with the same agent and input, its handle is
        returned instead of an error.
        """
        if group is not None:
            raise _unsupported("submit(group=...)", "submit group runs with AgentGroup.submit_many", "group")
        if session_key is not None:
            raise _unsupported("submit(session_key=...)", "the API does not serve sessions", "session_key")
        if hold_worker not in (None, "auto"):
            raise _unsupported(
                "submit(hold_worker=...) other than 'auto'", "the API does not hold workers", "hold_worker"
            )
        text = _encode_input(input)
        if name is None and idempotency_key is not None:
            name = _run_name(self.name, hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:12])
        idempotent = name is not None
        if name is None:
            name = _run_name(self.name, _secrets.token_hex(4))
        spec: dict[str, Any] = {"agent": self.name, "input": text}
        if deadline is not None:
            spec["deadline"] = _format_deadline(deadline)
        if keep_alive:
            spec["keepAlive"] = True
        manifest = {"apiVersion": API_VERSION, "kind": "AgentRun", "metadata": {"name": name}, "spec": spec}
        parse_resource(manifest)  # an oversized input or a bad deadline is refused before sending

        self._ensure_deployed()
        try:
            created = self.client.create("agentruns", manifest, project=self._project)
        except Conflict as exc:
            if not (idempotent and exc.code == "AlreadyExists"):
                raise
            existing = self.client.get("agentruns", name, project=self._project)
            same = {k: v for k, v in (existing.get("spec") or {}).items() if v not in (None, False)}
            if same != {k: v for k, v in spec.items() if v not in (None, False)}:
                raise Conflict(
                    f"agentrun/{name} already exists with a different spec (agent, input or deadline)",
                    code="AlreadyExists",
                    details={"kind": "AgentRun", "name": name},
                ) from None
            created = existing
        return AgentRun(created, project=self._project, client=self.client)

    def spawn(self, input: Any = None, **kwargs: Any) -> AgentRun:
        """The same as `submit`."""
        return self.submit(input, **kwargs)

    def remote(self, input: Any = None, **kwargs: Any) -> str:
        """Submit, wait and return the run's answer text; raises `errors.AgentRunFailed`."""
        if kwargs.get("keep_alive"):
            # A keep-alive run waits for messages instead of finishing, so this would never return.
            raise Invalid(
                "remote() waits for the run to finish and a keep-alive run does not; "
                "use submit(keep_alive=True)",
                details={"field": "keep_alive"},
            )
        return self.submit(input, **kwargs).result()

    def map(
        self,
        inputs: Iterable[Any],
        *,
        max_active: int | None = None,
        order_outputs: bool = True,
        return_exceptions: bool = False,
    ) -> AgentMap:
        """One run per input in an ephemeral AgentGroup; yields each run's answer text as it finishes.

        Answers come in input order (a finished run waits for the earlier ones), or as they
        finish with ``order_outputs=False``. A run that does not succeed raises
        `errors.AgentRunFailed`, or is yielded as that exception with ``return_exceptions=True``.
        ``max_active`` runs go at once (the server's group default when None).

        Nothing is sent until the first answer is asked for; the inputs are checked here, so a
        bad one raises now. Iterate with ``for`` or ``async for``. The group and its runs are
        deleted at the end, also when the loop stops early: closing the iterator (a ``break``
        that drops it, ``close()``, or a ``with`` block) cancels whatever is still running.
        """
        from .group import AgentMap  # the group module builds on this one

        return AgentMap(
            self,
            inputs,
            max_active=max_active,
            order_outputs=order_outputs,
            return_exceptions=return_exceptions,
        )

    def step(self, _fn: Callable[..., Any] | None = None, **kwargs: Any) -> NoReturn:
        raise _unsupported("Agent.step", f"runs execute on Claude, not as your code; {_LATER}", "step")

    def entrypoint(self, fn: Callable[..., Any]) -> NoReturn:
        raise _unsupported(
            "Agent.entrypoint", f"runs execute on Claude, not as your code; {_LATER}", "entrypoint"
        )

    def local(self, input: Any = None) -> NoReturn:
        raise _unsupported("Agent.local", f"it needs the durable Python runtime; {_LATER}", "local")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, project={self._project!r})"


@dataclass(frozen=True)
class SecretKey:
    """One key of a Secret, as the value of an environment variable of the agent's commands:
    ``env={"DB_PASSWORD": nodus.SecretKey("db", "PASSWORD")}``. The value never leaves the
    server, and is redacted from everything a run records."""

    secret: str
    key: str


def _env_entries(env: Mapping[str, str | SecretKey]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for name, value in env.items():
        if isinstance(value, SecretKey):
            entries.append(
                {"name": name, "valueFrom": {"secretKeyRef": {"name": value.secret, "key": value.key}}}
            )
        else:
            entries.append({"name": name, "value": value})
    return entries


def claude_agent_spec(
    *,
    system: str = "",
    families: list[str] | None = None,
    model: str | None = None,
    max_tokens: int | None = None,
    max_tool_calls: int | None = None,
    per_run_max_cost: Any = None,
    api_key_secret: str | None = None,
    image: str | None = None,
    env: Mapping[str, str | SecretKey] | None = None,
    allowed_hosts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The Agent spec of a Claude agent; shared by `ClaudeAgent` and ``nodus create agent``."""
    model_spec: dict[str, Any] = {"access": "BYOK" if api_key_secret else "Nodus"}
    if families:
        model_spec["families"] = list(families)
    if model is not None:
        model_spec["name"] = model
    if api_key_secret is not None:
        model_spec["apiKeySecret"] = api_key_secret
    spec: dict[str, Any] = {"system": system, "model": model_spec}
    if max_tokens is not None:
        spec["maxTokens"] = max_tokens
    if max_tool_calls is not None:
        spec["maxToolCalls"] = max_tool_calls
    cost = _usd(per_run_max_cost, "per_run_max_cost")
    if cost is not None:
        spec["perRunMaxCostUSD"] = cost
    if image is not None:
        spec["image"] = image
    if env:
        spec["env"] = _env_entries(env)
    if allowed_hosts is not None:
        spec["network"] = {"allowedHosts": list(allowed_hosts)}
    return spec


class ClaudeAgent(Agent):
    """An agent on Claude: a system prompt, the Claude access it runs on and a per-run cost cap.

    ``model`` pins a Claude model id; ``families`` restricts the router's choice instead.
    ``api_key_secret`` names a Secret holding ``ANTHROPIC_API_KEY`` (BYOK: the model is paid on
    your own Anthropic account). ``env`` sets variables of the run's commands, a `SecretKey`
    for a secret one; ``allowed_hosts`` are the hosts those commands may reach (nothing else,
    docs/network.md). The agent is created on first use unless `deploy` ran first.
    """

    def __init__(
        self,
        name: str,
        *,
        system: str = "",
        families: list[str] | None = None,
        model: str | None = None,
        max_tokens: int | None = None,
        max_tool_calls: int | None = None,
        per_run_max_cost: Any = None,
        api_key_secret: str | None = None,
        image: str | None = None,
        env: Mapping[str, str | SecretKey] | None = None,
        allowed_hosts: Sequence[str] | None = None,
        project: str | None = None,
        client: Client | None = None,
    ) -> None:
        spec = claude_agent_spec(
            system=system,
            families=families,
            model=model,
            max_tokens=max_tokens,
            max_tool_calls=max_tool_calls,
            per_run_max_cost=per_run_max_cost,
            api_key_secret=api_key_secret,
            image=image,
            env=env,
            allowed_hosts=allowed_hosts,
        )
        self._setup(name, spec, project, client)


# -- AgentRun ---------------------------------------------------------------------------------


class _ResourceHandle:
    """What the handles of runs and groups share: the resource as last seen, and its client.

    Built from a resource, a View of one, or just a name; `from_name` fetches it first.
    """

    _collection: ClassVar[str]
    _kind: ClassVar[str]

    def __init__(
        self,
        obj: Mapping[str, Any] | View | str,
        *,
        project: str | None = None,
        client: Client | None = None,
    ) -> None:
        resource: dict[str, Any]
        if isinstance(obj, str):
            resource = {"metadata": {"name": obj}}
        else:
            resource = obj.to_dict() if isinstance(obj, View) else dict(obj)
        name = (resource.get("metadata") or {}).get("name")
        if not isinstance(name, str):
            raise Invalid(f"an {self._kind} needs metadata.name", details={"field": "metadata.name"})
        self._resource = resource
        self.name = name
        self._project = project
        self._client = client or Client(project=project)

    @classmethod
    def from_name(cls, name: str, project: str | None = None, *, client: Client | None = None) -> Self:
        """The handle of one that exists (e.g. applied from YAML); raises `errors.NotFound`."""
        client = client or Client(project=project)
        return cls(client.get(cls._collection, name, project=project), project=project, client=client)

    @property
    def agent(self) -> str | None:
        """Its agent, as last seen."""
        return (self._resource.get("spec") or {}).get("agent")

    def _refresh(self) -> dict[str, Any]:
        self._resource = self._client.get(self._collection, self.name, project=self._project)
        return self._resource

    def status(self) -> View:
        """The latest resource (``.status.phase``, ``.status.cost``, ...), fetched now."""
        return View(self._refresh())

    def __repr__(self) -> str:
        phase = (self._resource.get("status") or {}).get("phase")
        shown = f", phase={phase!r}" if phase else ""
        return f"{self._kind}(name={self.name!r}, project={self._project or self._client.project!r}{shown})"

    def _poll_status(
        self,
        done: Callable[[dict[str, Any]], bool],
        timeout: float | None,
        still: Callable[[str], str],
    ) -> dict[str, Any]:
        """Poll the resource until ``done(status)`` and return that status.

        Polls back off from 0.1 s to 1 s. An unreachable API (a server restart) is waited out
        for up to 30 s, since runs and groups survive one; ``timeout`` raises `errors.WaitTimeout`
        with ``still(phase)`` as its message.
        """
        start = time.monotonic()
        delay = min(_POLL_FIRST_DELAY, _POLL_MAX_DELAY)
        unreachable_since: float | None = None
        phase = "unknown"
        while True:
            try:
                status = self._refresh().get("status") or {}
                unreachable_since = None
                phase = status.get("phase") or phase
                if done(status):
                    return status
            except Unavailable:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > _UNAVAILABLE_GRACE:
                    raise
            elapsed = time.monotonic() - start
            if timeout is not None and elapsed >= timeout:
                raise WaitTimeout(still(phase), details={"name": self.name, "phase": phase})
            pause = delay if timeout is None else min(delay, max(timeout - elapsed, 0.0))
            time.sleep(pause)
            delay = min(delay * 1.5, _POLL_MAX_DELAY)


class AgentRun(_ResourceHandle):
    """One AgentRun: `wait`, `result` (the answer text), `answer`, `steps`, `cancel`, `delete`."""

    _collection = "agentruns"
    _kind = "AgentRun"
    # The sequence number of the last message this handle sent: a keep-alive run has caught up
    # (its answer is the answer to that message) once it has read it.
    _sent_seq = 0

    def _caught_up(self, status: dict[str, Any]) -> bool:
        read = (status.get("messages") or {}).get("read") or 0
        return awaiting_message(status) and int(read) >= self._sent_seq

    def wait(self, timeout: float | None = None) -> View:
        """Block until the run is terminal, or (keep-alive) has answered every message this handle
        sent and waits for the next; return its status.

        Raises `errors.AgentRunFailed` for Failed or Cancelled, and for a run parked at its cost
        cap (``Waiting``, ``MaxCostReached``), which only a cancel or its deadline can end; and
        `errors.WaitTimeout` after ``timeout`` seconds. A briefly unreachable API (a server restart) is waited out.
        """
        status = self._poll_status(
            lambda now: now.get("phase") in TERMINAL_PHASES or at_cost_cap(now) or self._caught_up(now),
            timeout,
            lambda phase: f"agentrun/{self.name} is still {phase} after {timeout:g}s",
        )
        phase = status.get("phase")
        if phase != "Succeeded" and not awaiting_message(status):
            raise _run_failed(self.name, status)
        return View(status)

    def result(self) -> str:
        """The answer text, after waiting for the run; raises `errors.AgentRunFailed` unless it succeeded."""
        self.wait()
        return self.answer()

    def answer(self) -> str:
        """The run's full answer text, waiting while it is being written.

        It waits until the run ends, waits for a person or for funds, or (keep-alive) has answered
        the last message this handle sent, so ``run.send(...)`` then ``run.answer()`` gives the
        answer to that message. Unlike `result` it does not raise for a failed run that has an
        answer; a run that stopped without one raises `errors.Conflict` (``AnswerNotReady``).
        """
        self._poll_status(
            lambda now: (
                now.get("phase") in TERMINAL_PHASES
                or self._caught_up(now)
                or (now.get("phase") == "Waiting" and now.get("reason") != "AwaitingMessage")
            ),
            None,
            lambda phase: f"agentrun/{self.name} is still {phase}",
        )
        return str(self._client.run_answer(self.name, project=self._project).get("answer") or "")

    def steps(self) -> list[View]:
        """The journaled steps in order: sandbox, routing and model calls, commands, the answer."""
        return [View(step) for step in self._client.run_steps(self.name, project=self._project)]

    def cancel(self) -> None:
        """Stop the run and delete its sandbox; it ends Cancelled."""
        self._client.cancel_run(self.name, project=self._project)

    def delete(self) -> None:
        """Cancel the run if unfinished, then delete it with its journal and sandbox."""
        self._client.delete("agentruns", self.name, project=self._project)

    def _later(self, what: str) -> NoReturn:
        raise _unsupported(f"AgentRun.{what}", f"the API does not serve it yet; {_LATER}", what)

    def send(self, name: str, payload: Any, message_key: str | None = None) -> View:
        """Send a keep-alive run a message (``name`` is its kind, usually ``"message"``).

        The run reads it after its current turn, or now if it waits for one. The same
        ``message_key`` again is delivered once. A finished run refuses it with
        `errors.Conflict` (code ``AgentRunFinished``). Non-text payloads travel JSON-encoded.
        """
        text = _encode_input(payload)
        sent = self._client.send_message(
            self.name, text, message_key=message_key, message_name=name, project=self._project
        )
        self._sent_seq = max(self._sent_seq, int(sent.get("seq") or 0))
        return View(sent)

    def resolve(
        self,
        step_id: str,
        decision: str,
        *,
        evidence: str | None = None,
        result: Mapping[str, Any] | None = None,
        revision: int | None = None,
    ) -> View:
        """Decide a step whose outcome is unknown (the run waits with ``NeedsResolution``).

        ``decision`` is ``Completed`` (the command did run; ``result={"exitCode": 0, "output":
        "..."}`` is what it returned), ``NoEffect`` (it did nothing: it runs again) or
        ``Cancelled`` (the run fails). ``revision`` is the run's ``metadata.resourceVersion``
        the decision was made on (default: the run as it is now); a stale one is refused with
        `errors.Conflict` (``RevisionMismatch``), so two people cannot both decide.
        """
        if revision is None:
            revision = int((self._refresh().get("metadata") or {}).get("resourceVersion") or 0)
        body: dict[str, Any] = {"step": step_id, "decision": decision, "revision": revision}
        if evidence is not None:
            body["evidence"] = evidence
        if result is not None:
            body["result"] = dict(result)
        self._resource = self._client.resolve_run(self.name, body, project=self._project)
        return View(self._resource)

    def retry(self) -> NoReturn:
        self._later("retry")

    def suspend(self) -> NoReturn:
        self._later("suspend")

    def resume(self) -> NoReturn:
        self._later("resume")

    def children(self) -> NoReturn:
        self._later("children")

    @property
    def outputs(self) -> NoReturn:
        self._later("outputs")

    async def logs(self, follow: bool = False) -> AsyncIterator[str]:
        """The run's log, line by line: its steps, phase changes, turns and answer.

        With ``follow`` it goes on until the run ends (reconnecting by itself if the connection
        drops, without losing or repeating a line); without, it ends once caught up.
        """
        path = self._client._path("agentruns", self._project, self.name, "events")
        async with self._client.async_http() as http:
            async for event in afollow_events(http, path, follow=follow):
                line = log_line(event)
                if line is not None:
                    yield line


# -- RunContext -------------------------------------------------------------------------------


class RunContext(Protocol):
    """What an agent entrypoint receives as ``ctx``; the agent runtime provides the implementation."""

    idempotency_key: str
    state_dir: Path

    def step(self, name: str, fn: Callable[[], Any], effect: str = "pure") -> Any: ...

    def sleep(self, duration: str | float) -> None: ...

    def sleep_until(self, time: str) -> None: ...

    def wait_for_message(self, name: str, timeout: str | float | None = None) -> Any: ...

    def send(self, target: str, name: str, payload: Any) -> None: ...

    def spawn(self, input: Any, key: str, permissions: Any = None, deadline: str | None = None) -> Any: ...

    def gather(self, children: list[Any], return_exceptions: bool = False) -> list[Any]: ...

    def map(self, inputs: Iterable[Any]) -> list[Any]: ...

    def child_output(self, child: Any, name: str) -> Any: ...

    def save_output(self, name: str, path: str) -> None: ...

    def continue_as_new(self, input: Any) -> None: ...
