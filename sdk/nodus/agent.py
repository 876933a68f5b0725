"""Agents from Python: define, deploy, submit runs, wait for answers.

This is the client side of the product's ``nodus.agent`` module, over HTTP only. The server runs
every agent on Claude, and runs many of them at once through an `AgentGroup` (a shared concurrency
limit, one cost cap, dependencies between tasks; `Agent.map` is the one-call form). It does not
yet run user code, messages or group evaluations. Whatever a call names that the server cannot do
raises `errors.Unsupported` *before anything is sent*, because a silently dropped setting is one
the user believes in and does not get.

`Agent` and `ClaudeAgent` are definitions; what they return lives elsewhere: `AgentRun` (the
handle of a run, `agent_run`), `AgentMap` (`Agent.map`, `agent_map`) and `View` (`view`).
"""

from __future__ import annotations

import hashlib
import secrets as _secrets
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Self

from .agent_run import AgentRun, RunContext
from .agent_spec import AGENT_PARAMS, SecretKey, claude_agent_spec
from .client import Client
from .errors import Conflict, Invalid, Unsupported
from .handles import _LATER, _encode_input, _format_deadline, _run_name, _unsupported, _usd
from .resources import (
    API_VERSION,
    parse_resource,
)
from .view import View

if TYPE_CHECKING:
    from .agent_map import AgentMap

# AgentRun, RunContext and View are re-exported: ``from nodus.agent import AgentRun`` keeps working.
__all__ = ["View", "Agent", "ClaudeAgent", "AgentRun", "RunContext", "SecretKey", "claude_agent_spec"]


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
        from .agent_map import AgentMap  # the map module builds on this one

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


class ClaudeAgent(Agent):
    """An agent on Claude: a system prompt, the Claude access it runs on and a per-run cost cap.

    ``model`` pins a Claude model id; ``families`` restricts the router's choice instead.
    ``api_key_secret`` names a Secret holding ``ANTHROPIC_API_KEY`` (BYOK: the model is paid on
    your own Anthropic account). ``env`` sets variables of the run's commands, a `SecretKey`
    for a secret one; ``allowed_hosts`` are the hosts those commands may reach (nothing else,
    docs/network.md). The agent is created on first use unless `deploy` ran first.

    Its settings are the rows of `agent_spec.AGENT_PARAMS`, where each one's spec field is.
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
        given = locals()
        spec = claude_agent_spec(**{param.name: given[param.name] for param in AGENT_PARAMS})
        self._setup(name, spec, project, client)
