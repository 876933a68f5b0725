"""Agents from Python: define, deploy, submit runs, wait for answers.

This is the client side of the product's ``nodus.agent`` module, over HTTP only. An Agent is
either a Claude agent (`ClaudeAgent`: a system prompt the server runs on Claude) or a durable
Python agent: your program (``@agent.entrypoint``, ``@agent.step``, or ``source=`` and
``entrypoint=``) that the server runs in the run's sandbox, journaling every step so a run
survives its process (docs/python-agents.md). Many runs go at once through an `AgentGroup`
(`Agent.map` is the one-call form). Whatever a call names that the server cannot do raises
`errors.Unsupported` *before anything is sent*, because a silently dropped setting is one the
user believes in and does not get.

`Agent` and `ClaudeAgent` are definitions; what they return lives elsewhere: `AgentRun` (the
handle of a run, `agent_run`), `AgentMap` (`Agent.map`, `agent_map`) and `View` (`view`).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ._runtime.definition import ProgramDefinition, guard_client_call
from ._runtime.sources import check_source, source_files
from .agent_run import AgentRun, RunContext
from .agent_spec import AGENT_PARAMS, Egress, SecretKey, claude_agent_spec, python_agent_spec, worker_settings
from .agent_submit import create_run, run_manifest
from .client import Client
from .errors import Invalid, Unsupported
from .handles import _run_name as _run_name  # still importable from here, as callers do
from .handles import _unsupported
from .resources import (
    API_VERSION,
    parse_resource,
)
from .schema_agent import source_ref
from .view import View

if TYPE_CHECKING:
    from .agent_map import AgentMap
    from .group import AgentGroup

# AgentRun, RunContext and View are re-exported: ``from nodus.agent import AgentRun`` keeps working.
__all__ = [
    "View",
    "Agent",
    "AgentGroup",
    "ClaudeAgent",
    "AgentRun",
    "RunContext",
    "SecretKey",
    "Egress",
    "claude_agent_spec",
]

F = TypeVar("F", bound=Callable[..., Any])
# On a ready-made template of project nodus (`Agent.from_name`): its runs go to the caller's project.
_TEMPLATE_LABEL = "nodus.dev/template"
# Stands in for the program while a definition is checked before its entrypoint is known.
_PLACEHOLDER_SOURCE = {"digest": "sha256:" + "0" * 64, "files": 1, "bytes": 0}


# -- Agent ------------------------------------------------------------------------------------


class Agent:
    """A durable agent definition; deploy it, then submit runs with `remote`, `submit` or `map`.

    A Python agent's program is the ``@agent.entrypoint`` function's module (uploaded by
    `deploy`), or ``source=`` (a file, a directory or a dict of files) with ``entrypoint=``
    (``"module:function"``). ``setup`` runs once per run before it (``pip install ...``);
    ``secrets`` (`SecretKey`) and ``env`` become its environment, ``network`` (`Egress`) the hosts
    it may reach, ``models`` the Claude families its model calls are routed among; ``cpu`` (cores)
    and ``memory`` (``"2Gi"``) are its limits, ``per_run_max_cost`` and ``max_cost`` (all runs
    together) its caps. Without a program, the agent runs on Claude, as `ClaudeAgent` does.

    ``max_workers`` is its concurrency limit (runs holding an actor at once; more wait Pending,
    ``MaxWorkersReached``), ``min_workers`` the pre-started run actors kept for it and
    ``scaledown_window`` (``"5m"`` or a `timedelta`) how long an idle one beyond those stays.
    ``app`` raises `errors.Unsupported`.
    """

    # Settings the server cannot honour yet: refused at construction, before anything is sent.
    _UNSUPPORTED_ARGS: tuple[str, ...] = ("app",)

    name: str

    def __init__(
        self,
        name: str,
        *,
        image: Any = None,
        source: str | Path | Mapping[str, Any] | None = None,
        entrypoint: str | None = None,
        setup: str | None = None,
        secrets: Sequence[SecretKey] | None = None,
        env: Mapping[str, str | SecretKey] | None = None,
        network: Egress | None = None,
        models: Sequence[str] | None = None,
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
                    "an Agent is deployed on its own, not into an app; leave it out",
                    arg,
                )
        if image is not None and not isinstance(image, str):
            raise Unsupported(
                "Agent(image=...) takes an image reference string for now", details={"field": "image"}
            )
        if source is not None and not isinstance(source, str | Path | Mapping):
            raise Invalid(
                "source is a file, a directory or a dict of files (path -> text)", details={"field": "source"}
            )
        if entrypoint is not None and not isinstance(entrypoint, str):
            raise Invalid(
                'entrypoint is "module:function", e.g. "main:main"', details={"field": "entrypoint"}
            )
        spec = python_agent_spec(
            image=image,
            setup=setup,
            secrets=secrets,
            env=env,
            network=network,
            models=models,
            per_run_max_cost=per_run_max_cost,
            max_cost=max_cost,
            cpu=cpu,
            memory=memory,
        )
        spec.update(worker_settings(min_workers, max_workers, scaledown_window))
        self._source = source
        self._entrypoint = entrypoint
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
        manifest: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": "Agent",
            "metadata": {"name": name},
            "spec": spec,
        }
        self.__dict__.setdefault("_source", None)
        self.__dict__.setdefault("_entrypoint", None)
        self._definition = ProgramDefinition()
        if validate:  # refuse a bad definition here, before anything is sent
            self._check(manifest)
        self.name = name
        self._manifest = manifest
        self._project = project
        self._client = client
        self._deployed = False
        self._lock = threading.Lock()

    @classmethod
    def from_name(cls, name: str, project: str | None = None, *, client: Client | None = None) -> Self:
        """A deployed Agent, submitted to without redeploying it; raises `errors.NotFound`.

        A ready-made template (``from_name("claude-assistant", project="nodus")``, an Agent
        labelled ``nodus.dev/template``) is read from its project but runs in yours: `submit`,
        `remote` and `map` create runs in the client's project (a project token's own project),
        billed there and pinned to the template's revision; the server finds the template by
        its name when your project has no Agent of that name (docs/sdk.md).
        """
        client = client or Client()
        resource = client.get("agents", name, project=project)
        agent = cls.__new__(cls)
        runs_in = project
        labels = (resource.get("metadata") or {}).get("labels") or {}
        if labels.get(_TEMPLATE_LABEL) == "true":
            who = client.whoami()
            runs_in = client.project if who.get("project") in (None, "*") else str(who["project"])
        # The server's spec is taken as is: a newer server may hold fields this SDK does not know.
        Agent._setup(agent, name, dict(resource.get("spec") or {}), runs_in, client, validate=False)
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

    def _check(self, manifest: dict[str, Any]) -> None:
        """Validate the manifest; a Python agent's settings with a stand-in for its program."""
        spec = manifest["spec"]
        if "source" not in spec and (self._source is not None or self._entrypoint or "setup" in spec):
            manifest = copy.deepcopy(manifest)
            manifest["spec"]["source"] = _PLACEHOLDER_SOURCE
            manifest["spec"]["entrypoint"] = self._entrypoint or "main:main"
        parse_resource(manifest)

    def _program(self) -> tuple[dict[str, str], str] | None:
        """The files and entrypoint to deploy, checked as the server checks them; None for an
        agent without a program (it runs on Claude)."""
        registered = self._definition.entrypoint_fn is not None
        if self._source is None and self._entrypoint is None and not registered:
            return None
        entrypoint = self._entrypoint or (self._definition.entrypoint_ref() if registered else None)
        if entrypoint is None:
            raise Invalid(
                'source= needs entrypoint="module:function" or an @agent.entrypoint function',
                details={"field": "entrypoint"},
            )
        if self._source is None and not registered:
            raise Invalid(
                "entrypoint= needs source= (a file, a directory or a dict of files), or decorate the "
                "function with @agent.entrypoint so its module is the source",
                details={"field": "source"},
            )
        files = source_files(self._source) if self._source is not None else self._definition.module_source()
        check_source(files, entrypoint)
        return files, entrypoint

    def manifest(self) -> dict[str, Any]:
        """The Agent document `deploy` applies (a program's source as its digest); sends nothing."""
        manifest = copy.deepcopy(self._manifest)
        program = self._program()
        if program is not None:
            manifest["spec"]["source"] = source_ref(program[0])
            manifest["spec"]["entrypoint"] = program[1]
        return manifest

    def deploy(self) -> View:
        """Create or update the Agent; every accepted change is a new revision, and new runs pin it.

        A Python agent's source is checked here (every ``.py`` file compiles, the entrypoint is
        defined at the top level of its module; `errors.Invalid` naming file and line) before
        anything is sent, then uploaded (stored once per content), then the Agent is applied.
        """
        guard_client_call("deploy")
        manifest = copy.deepcopy(self._manifest)
        program = self._program()
        if program is not None:
            files, entrypoint = program
            manifest["spec"]["source"] = source_ref(files)
            manifest["spec"]["entrypoint"] = entrypoint
            parse_resource(manifest)  # the whole document, before the upload
            manifest["spec"]["source"] = self.client.upload_source(files, project=self._project)
        applied = self.client.apply("agents", manifest, project=self._project)
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
        labels: Mapping[str, str] | None = None,
    ) -> AgentRun:
        """Start a run and return its handle; deploys the agent first if `deploy` was not called.
        ``labels`` become its ``metadata.labels``, which `runs` and ``nodus get -l`` select on.

        A ``name`` (or an ``idempotency_key``, from which the name is derived) makes redelivery
        idempotent: when that run exists already with the same agent and input, its handle is
        returned instead of an error.

        ``session_key`` (a DNS label, e.g. a conversation's id) sends ``input`` as a message to
        the live run of this agent that holds the key, or, when none does (the first submit, or
        the last run holding it finished), starts a keep-alive run that holds it: one live run
        per project, agent and key. The handle is that run's either way (``run.name``). With an
        ``idempotency_key`` too, the same submit again is delivered once. ``deadline`` applies
        to a run it starts; a message delivered to a live run leaves that run's deadline as is.
        """
        guard_client_call("submit")
        manifest, idempotent = run_manifest(
            self.name,
            input,
            idempotency_key=idempotency_key,
            session_key=session_key,
            deadline=deadline,
            group=group,
            hold_worker=hold_worker,
            name=name,
            keep_alive=keep_alive,
            labels=labels,
        )
        self._ensure_deployed()
        return create_run(
            self.client, self._project, manifest, idempotent=idempotent, session=session_key is not None
        )

    def spawn(self, input: Any = None, **kwargs: Any) -> AgentRun:
        """The same as `submit`."""
        return self.submit(input, **kwargs)

    def remote(self, input: Any = None, **kwargs: Any) -> str:
        """Submit, wait and return the run's answer text; raises `errors.AgentRunFailed`."""
        guard_client_call("remote")
        if kwargs.get("keep_alive") or kwargs.get("session_key") is not None:
            # A keep-alive run waits for messages instead of finishing, so this would never return.
            raise Invalid(
                "remote() waits for the run to finish and a keep-alive run does not; "
                "use submit(keep_alive=True) or submit(session_key=...)",
                details={"field": "session_key" if kwargs.get("session_key") is not None else "keep_alive"},
            )
        return self.submit(input, **kwargs).result()

    def map(
        self,
        inputs: Iterable[Any],
        *,
        max_active: int | None = None,
        order_outputs: bool = True,
        return_exceptions: bool = False,
        labels: Mapping[str, str] | None = None,
    ) -> AgentMap:
        """One run per input in an ephemeral AgentGroup; yields each run's answer text as it finishes.

        Answers come in input order (a finished run waits for the earlier ones), or as they
        finish with ``order_outputs=False``. A run that does not succeed raises
        `errors.AgentRunFailed`, or is yielded as that exception with ``return_exceptions=True``.
        ``max_active`` runs go at once (the server's group default when None); ``labels`` label each run.

        Nothing is sent until the first answer is asked for; the inputs are checked here, so a
        bad one raises now. Iterate with ``for`` or ``async for``. The group and its runs are
        deleted at the end, also when the loop stops early: closing the iterator (a ``break``
        that drops it, ``close()``, or a ``with`` block) cancels whatever is still running.
        """
        guard_client_call("map")
        from .agent_map import AgentMap  # the map module builds on this one

        return AgentMap(
            self,
            inputs,
            max_active=max_active,
            order_outputs=order_outputs,
            return_exceptions=return_exceptions,
            labels=labels,
        )

    def runs(
        self, *, labels: Mapping[str, str] | str | None = None, phase: str | None = None
    ) -> list[AgentRun]:
        """This agent's runs, oldest first, selected on the server (`nodus.list_runs` has every filter)."""
        from .listing import list_runs

        return list_runs(
            agent=self.name, labels=labels, phase=phase, project=self._project, client=self.client
        )

    def step(
        self, _fn: Callable[..., Any] | None = None, *, effect: str = "pure", name: str | None = None
    ) -> Any:
        """Journal a function as a step: ``pure``, ``idempotent`` or ``external`` (an interrupted
        external step's outcome is unknown, and the run waits for `AgentRun.resolve`).

        In a run, a completed step returns its recorded result on replay without running; outside
        a run (a script, a test) it is a plain call. ``@agent.step`` or ``@agent.step(effect=...)``.
        """
        try:
            return self._definition.step(_fn, effect=effect, name=name)
        except ValueError as exc:
            raise Invalid(
                f"Agent.step: {exc}", details={"field": "effect" if "effect" in str(exc) else "name"}
            ) from None

    def entrypoint(self, fn: F) -> F:
        """Mark ``fn(ctx, input)`` as the run entrypoint; unless ``source=`` was given, its module
        is uploaded as the Agent's source by `deploy`."""
        return self._definition.entrypoint(fn)

    def local(
        self,
        input: Any = None,
        *,
        messages: Mapping[str, Any] | None = None,
        outputs_dir: str | Path | None = None,
    ) -> Any:
        """Run the entrypoint in this process with an in-memory journal: no server, no Ray.

        ``messages`` answers ``ctx.wait_for_message(name)``: ``{name: [payload, ...]}``, one per
        wait in order (a name with none left times out at once). Saved outputs are copied under
        ``outputs_dir`` (a temporary directory by default). Returns the entrypoint's return
        value; a program that raises raises here.
        """
        guard_client_call("local")
        from ._runtime.local import run_local  # the in-process runtime, loaded when used

        if self._definition.entrypoint_fn is None:
            raise Invalid(
                "Agent.local runs the @agent.entrypoint function; this agent has none",
                details={"field": "entrypoint"},
            )
        outputs = Path(outputs_dir) if outputs_dir is not None else None
        return run_local(self._definition, input, messages=dict(messages or {}), outputs_dir=outputs)

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

    # A ClaudeAgent is a system prompt the server runs on Claude, not a program.
    _NOT_A_PROGRAM = "a ClaudeAgent runs its system prompt on Claude; define a program with nodus.Agent"

    def step(
        self, _fn: Callable[..., Any] | None = None, *, effect: str = "pure", name: str | None = None
    ) -> Any:
        raise _unsupported("ClaudeAgent.step", self._NOT_A_PROGRAM, "step")

    def entrypoint(self, fn: F) -> F:
        raise _unsupported("ClaudeAgent.entrypoint", self._NOT_A_PROGRAM, "entrypoint")

    def local(
        self,
        input: Any = None,
        *,
        messages: Mapping[str, Any] | None = None,
        outputs_dir: str | Path | None = None,
    ) -> Any:
        raise _unsupported("ClaudeAgent.local", self._NOT_A_PROGRAM, "local")


def __getattr__(name: str) -> Any:
    """The reference (000) documents AgentGroup in ``nodus.agent``; it lives in `group`, which
    builds on this module, so it is loaded when first asked for here (whichever of the two
    modules a program imports first)."""
    if name == "AgentGroup":
        from .group import AgentGroup

        return AgentGroup
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
