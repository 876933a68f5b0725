"""``nodus``: kubectl-style verbs over the nodus API (apply, get, wait, create, cancel, delete).

Every failure ends as exactly one ``error: ...`` line on stderr and a non-zero exit code (2 for
usage mistakes, 1 for everything else), never a traceback: the CLI is used from scripts and CI
logs where a stack trace hides the one sentence that matters. ``NODUS_DEBUG=1`` re-raises
unexpected exceptions for developers.

Nothing here imports Ray; only ``nodus up`` and ``nodus down`` load the server parts, lazily.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Annotated, Any, NoReturn
from urllib.parse import quote, urlencode

import httpx
import typer
import yaml
from typer.core import TyperGroup

from .. import __version__, credentials
from ..agent import SecretKey, claude_agent_spec
from ..client import Client
from ..config import ENV_API_URL, ENV_PROJECT, Settings, load_settings
from ..errors import NodusError, NotFound, Unavailable
from ..events import log_line
from ..resources import (
    API_VERSION,
    GROUP_TERMINAL_PHASES,
    SHORT_NAMES,
    TERMINAL_PHASES,
    at_cost_cap,
    parse_resource,
)
from . import jsonpath
from .batch import batch_app
from .durations import format_age, parse_timeout
from .manifests import load_manifests
from .output import dump_json, dump_yaml, print_table, shorten

__all__ = ["app", "run", "CliError"]

# Typer 0.2x ships its own copy of click (``typer._click``) while older releases use the click
# package; usage errors must be caught as the classes *this* typer raises, so take them from it.
_CLICK = typer.BadParameter.__module__.rpartition(".")[0]
_click_exceptions: Any = importlib.import_module(f"{_CLICK}.exceptions")
_click_globals: Any = importlib.import_module(f"{_CLICK}.globals")
UsageError: type[Exception] = _click_exceptions.UsageError
ClickException: type[Exception] = _click_exceptions.ClickException
_ABORTS: tuple[type[BaseException], ...] = tuple(
    {typer.Abort, getattr(_click_exceptions, "Abort", typer.Abort)}
)
_NO_ARGS_HELP: Any = getattr(_click_exceptions, "NoArgsIsHelpError", ())  # click >= 8.2

_SETTINGS = "nodus.settings"
_KIND_HELP = (
    "agent (agents), agentrun (agentruns, ar), agentgroup (agentgroups, ag), secret (secrets), "
    "environment (environments, env)"
)


class CliError(ClickException):
    """A failure the CLI reports as one line, with its own exit code."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _describe(exc: NodusError) -> str:
    message = exc.message or exc.code
    field = exc.details.get("field") if isinstance(exc.details, dict) else None
    if field and str(field) not in message:
        message += f" (field: {field})"
    return message


class _NodusGroup(TyperGroup):
    """The root command: turns every exception into one ``error:`` line and an exit code."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            result = super().main(
                args,
                prog_name or "nodus",
                complete_var,
                standalone_mode=False,
                windows_expand_args=windows_expand_args,
                **extra,
            )
            code = result if isinstance(result, int) else 0
        except _NO_ARGS_HELP as exc:
            if exc.format_message().strip():  # with rich help the text was printed already
                exc.show()
            code = exc.exit_code
        except UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            code = _report(exc.format_message() + hint, exc.exit_code)
        except ClickException as exc:
            code = _report(exc.format_message(), exc.exit_code)
        except _ABORTS:
            code = _report("aborted", 130)
        except NodusError as exc:
            code = _report(_describe(exc), 1)
        except yaml.YAMLError as exc:
            code = _report(f"malformed YAML: {exc}", 1)
        except OSError as exc:
            code = _report(f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""), 1)
        except httpx.HTTPError as exc:
            code = _report(f"HTTP error: {exc}", 1)
        except Exception as exc:  # the promise is one line, whatever went wrong
            if os.environ.get("NODUS_DEBUG"):
                raise
            code = _report(f"unexpected {type(exc).__name__}: {exc} (set NODUS_DEBUG=1 for a traceback)", 1)
        if standalone_mode:
            sys.exit(code)
        return code


def _report(message: str, code: int) -> int:
    typer.echo(f"error: {_one_line(message)}", err=True)
    return code


app = typer.Typer(
    cls=_NodusGroup,
    name="nodus",
    help="Durable LLM agent runs on Ray: apply agents, start runs, wait for answers.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
create_app = typer.Typer(help="Create a resource from flags instead of a file.", no_args_is_help=True)
agentrun_app = typer.Typer(
    help="Read a run's answer and steps; send a keep-alive run a message.", no_args_is_help=True
)
app.add_typer(create_app, name="create")
app.add_typer(agentrun_app, name="agentrun")
credits_app = typer.Typer(
    help="The project's credits: what runs on the server's key may spend.", invoke_without_command=True
)
app.add_typer(credits_app, name="credits")
app.add_typer(batch_app, name="batch")

ProjectOption = Annotated[
    str | None, typer.Option("--project", "-p", help=f"Project (default: ${ENV_PROJECT} or 'default').")
]
TargetsArgument = Annotated[
    list[str], typer.Argument(help="KIND/NAME, or KIND NAME.", metavar="KIND/NAME", show_default=False)
]
OutputOption = Annotated[
    str | None, typer.Option("--output", "-o", help="yaml, json, wide, name or jsonpath={.a.b}.")
]


@app.callback()
def _root(
    ctx: typer.Context,
    api_url: Annotated[
        str | None, typer.Option("--api-url", envvar=ENV_API_URL, help="The nodus API base URL.")
    ] = None,
    project: Annotated[
        str | None,
        typer.Option("--project", "-p", envvar=ENV_PROJECT, help="Project of every resource named."),
    ] = None,
) -> None:
    ctx.meta[_SETTINGS] = load_settings(api_url=api_url, project=project)


def _settings() -> Settings:
    ctx = _click_globals.get_current_context(silent=True)
    settings = ctx.meta.get(_SETTINGS) if ctx is not None else None
    return settings or load_settings()


def _client(project: str | None = None) -> Client:
    return Client(settings=_settings(), project=project)


# -- kinds and targets ------------------------------------------------------------------------


def _kind(text: str) -> tuple[str, str]:
    """``ar`` -> ``("AgentRun", "agentruns")``; an unknown kind is a usage error."""
    key = text.strip().lower()
    if key in SHORT_NAMES:
        return SHORT_NAMES[key]
    raise UsageError(f"unknown kind {text!r}; known kinds: {_KIND_HELP}")


def _targets(args: Sequence[str], *, need_name: bool) -> list[tuple[str, str, str | None]]:
    """``KIND/NAME ...`` or ``KIND [NAME ...]`` -> ``[(kind, collection, name | None)]``."""
    if not args:
        raise UsageError(f"name a kind ({_KIND_HELP}), as KIND/NAME or KIND NAME")
    if "/" in args[0]:
        targets = []
        for arg in args:
            kind_text, _, name = arg.partition("/")
            if not name:
                raise UsageError(f"{arg!r} names no resource; write KIND/NAME")
            targets.append((*_kind(kind_text), name))
        return targets
    kind, collection = _kind(args[0])
    names = list(args[1:])
    if any("/" in name for name in names):
        raise UsageError("mix of KIND NAME and KIND/NAME; write one form")
    if not names:
        if need_name:
            raise UsageError(f"name the {kind} as {kind.lower()}/NAME or {kind.lower()} NAME")
        return [(kind, collection, None)]
    return [(kind, collection, name) for name in names]


def _ref(kind: str, name: str) -> str:
    return f"{kind.lower()}/{name}"


# -- up / down / version ----------------------------------------------------------------------


def _cluster() -> Any:
    try:
        from nodus_ray import cluster  # the only Ray-importing path of the CLI, on purpose
    except ImportError as exc:
        raise CliError(
            f"the nodus-ray server parts are not installed here ({exc}); "
            "install nodus-ray with its Ray dependencies to run `nodus up`"
        ) from None
    return cluster


@app.command()
def up(
    address: Annotated[
        str | None, typer.Option(help="Ray address to join (default: start a local Ray).")
    ] = None,
    port: Annotated[int, typer.Option(help="Port of the HTTP API.")] = 8000,
    storage: Annotated[str | None, typer.Option(help="Storage URI for resources and journals.")] = None,
) -> None:
    """Start (or join) Ray and the nodus API on this machine."""
    started = _cluster().up(address=address, port=port, storage=storage)
    lines = [
        ("API", "api_url"),
        ("Storage", "storage"),
        ("Models", "model_backend"),
        ("Sandbox", "sandbox"),
        ("Ray", "ray_address"),
        ("Dashboard", "dashboard_url"),
    ]
    for label, attribute in lines:
        value = getattr(started, attribute, None)
        typer.echo(f"{label:<10}{value if value not in (None, '') else '-'}")
    if getattr(started, "credentials_file", None):
        typer.echo(
            f"{'Token':<10}an operator token (local-admin) for this user, kept in {started.credentials_file}"
        )


@app.command()
def down() -> None:
    """Stop the nodus API and the local Ray started by `nodus up`."""
    typer.echo(str(_cluster().down()))


@app.command()
def version(
    client_only: Annotated[bool, typer.Option("--client", help="Print only the client version.")] = False,
) -> None:
    """Print the client version and, when reachable, the server's."""
    typer.echo(f"Client Version: {__version__}")
    if client_only:
        return
    info = _client().info()
    details = ", ".join(
        f"{label} {info[key]}"
        for label, key in (("storage", "storage"), ("models", "modelBackend"), ("sandbox", "sandbox"))
        if info.get(key)
    )
    typer.echo(f"Server Version: {info.get('version', 'unknown')}" + (f" ({details})" if details else ""))


# -- apply / create / patch -------------------------------------------------------------------


def _revision_marks(resource: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What changes when an apply changed something: the revision, generation and labels."""
    if resource is None:
        return None
    metadata = resource.get("metadata") or {}
    status = resource.get("status") or {}
    return (status.get("revision"), metadata.get("generation"), metadata.get("labels") or {})


def _manifest_project(manifest: Any, project: str | None) -> str | None:
    """The document's project unless -p names another, which is refused like kubectl does."""
    if project and manifest.project and manifest.project != project:
        raise UsageError(
            f"{manifest.ref} names project {manifest.project!r} but -p is {project!r}; "
            f"pass -p {manifest.project} or remove metadata.project"
        )
    return manifest.project or project


@app.command()
def apply(
    filenames: Annotated[
        list[str], typer.Option("--filename", "-f", help="YAML file to apply (repeatable; - reads stdin).")
    ],
    project: ProjectOption = None,
) -> None:
    """Create or update every resource of the files, in order; all are validated first."""
    manifests = load_manifests(filenames)
    for manifest in manifests:
        if manifest.kind == "Token":  # before anything is sent: all or nothing, like every refusal here
            raise UsageError(
                f"{manifest.ref}: a Token is not applied from a file; create it with "
                "`nodus create token NAME --role ROLE` (its value is shown once)"
            )
    client = _client(project)
    for manifest in manifests:
        target_project = _manifest_project(manifest, project)
        try:
            before = client.get(manifest.collection, manifest.name, project=target_project)
        except NotFound:
            before = None
        applied = client.apply(manifest.collection, manifest.body(), project=target_project)
        if applied.result in ("created", "configured", "unchanged"):
            verb = applied.result
        elif applied.created:
            verb = "created"
        elif before is not None and _revision_marks(before) == _revision_marks(applied.resource):
            verb = "unchanged"
        else:
            verb = "configured"
        typer.echo(f"{manifest.ref} {verb}")


def _create(kind: str, collection: str, name: str, spec: dict[str, Any], project: str | None) -> None:
    manifest = {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name}, "spec": spec}
    parse_resource(manifest)
    _client(project).create(collection, manifest)
    typer.echo(f"{_ref(kind, name)} created")


@create_app.command("agentrun")
def create_agentrun(
    name: Annotated[str, typer.Argument(help="Name of the run.")],
    agent: Annotated[str, typer.Option("--agent", help="The Agent to run.")],
    prompt: Annotated[str, typer.Option("--prompt", help="The run's input text.")],
    deadline: Annotated[str | None, typer.Option(help="Lifetime bound, e.g. 30m or 2h.")] = None,
    keep_alive: Annotated[
        bool,
        typer.Option("--keep-alive", help="Wait for messages after each turn (see `nodus agentrun send`)."),
    ] = False,
    group: Annotated[
        str | None,
        typer.Option("--group", help="Run as a task of this AgentGroup (NAME is <group>-<task-key>)."),
    ] = None,
    task_key: Annotated[
        str | None, typer.Option("--task-key", help="The task's key in the group, unique there.")
    ] = None,
    depends_on: Annotated[
        list[str] | None,
        typer.Option("--depends-on", help="Task key of the group this run waits for (repeatable)."),
    ] = None,
    project: ProjectOption = None,
) -> None:
    """Start a run of an agent, alone or as a task of an AgentGroup."""
    spec: dict[str, Any] = {"agent": agent, "input": prompt}
    if deadline is not None:
        spec["deadline"] = deadline
    if keep_alive:
        spec["keepAlive"] = True
    if group is not None:
        spec["group"] = group
    if task_key is not None:
        spec["taskKey"] = task_key
    if depends_on:
        spec["dependsOn"] = list(depends_on)
    _create("AgentRun", "agentruns", name, spec, project)


@create_app.command("agentgroup")
def create_agentgroup(
    name: Annotated[str, typer.Argument(help="Name of the group.")],
    agent: Annotated[str, typer.Option("--agent", help="The Agent every run of the group uses.")],
    max_active: Annotated[
        int | None, typer.Option("--max-active", help="Runs that go at once, 1 to 1000 (default 10).")
    ] = None,
    max_pending: Annotated[
        int | None, typer.Option("--max-pending", help="Unfinished runs the group takes in (default 10000).")
    ] = None,
    max_cost: Annotated[
        str | None, typer.Option("--max-cost", help="Cost cap of the whole group in USD, e.g. 0.60.")
    ] = None,
    environment: Annotated[
        str | None,
        typer.Option("--environment", help="Evaluate on this Environment, e.g. nodus/arithmetic-v2@2.0.0."),
    ] = None,
    tasks: Annotated[int | None, typer.Option("--tasks", help="Evaluation: tasks to generate.")] = None,
    split: Annotated[
        str | None, typer.Option("--split", help="Evaluation: the split (default test).")
    ] = None,
    repetitions: Annotated[
        int | None, typer.Option("--repetitions", help="Evaluation: runs per task (default 1).")
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Evaluation: the batch's seed (default 0).")
    ] = None,
    timeout: Annotated[
        str | None,
        typer.Option("--timeout", help="Evaluation: deadline from creation, 1m to 24h (default 30m)."),
    ] = None,
    project: ProjectOption = None,
) -> None:
    """Create an AgentGroup: runs of one agent under one concurrency limit and one cost cap.

    With --environment it is an evaluation group: it generates the Environment's task batch,
    runs and grades it, and needs no runs and no seal (see `nodus evaluation results`).
    """
    spec: dict[str, Any] = {"agent": agent}
    limits = {
        key: value
        for key, value in (("maxActive", max_active), ("maxPending", max_pending))
        if value is not None
    }
    if limits:
        spec["limits"] = limits
    if max_cost is not None:
        spec["maxCostUSD"] = max_cost
    evaluation = {
        key: value
        for key, value in (
            ("environment", environment),
            ("tasks", tasks),
            ("split", split),
            ("repetitions", repetitions),
            ("seed", seed),
            ("timeout", timeout),
        )
        if value is not None
    }
    if evaluation and environment is None:
        flags = ", ".join(f"--{key}" for key in evaluation)
        raise UsageError(f"{flags} describe an evaluation: add --environment OWNER/NAME@VERSION")
    if evaluation:
        spec["evaluation"] = evaluation
    _create("AgentGroup", "agentgroups", name, spec, project)


@create_app.command("secret")
def create_secret(
    name: Annotated[str, typer.Argument(help="Name of the secret.")],
    from_literal: Annotated[
        list[str],
        typer.Option("--from-literal", help="KEY=VALUE (repeatable), e.g. ANTHROPIC_API_KEY=sk-..."),
    ],
    project: ProjectOption = None,
) -> None:
    """Create a secret; its values are sealed on the server and never shown again."""
    values: dict[str, str] = {}
    for item in from_literal:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--from-literal takes KEY=VALUE, got {key[:40]!r} without '='")
        values[key] = value
    manifest = {"apiVersion": API_VERSION, "kind": "Secret", "metadata": {"name": name}, "stringData": values}
    parse_resource(manifest)
    _client(project).create("secrets", manifest)
    typer.echo(f"{_ref('Secret', name)} created")


@create_app.command("token")
def create_token(
    name: Annotated[str, typer.Argument(help="Name of the token, e.g. ci-reader.")],
    role: Annotated[str, typer.Option("--role", help="read, write or admin.")] = "read",
    expires_in: Annotated[
        str | None,
        typer.Option("--expires-in", help="Accepted for this long, e.g. 720h (default: until revoked)."),
    ] = None,
    project: ProjectOption = None,
) -> None:
    """Create an API token of the project and print it: it is shown this once only."""
    spec: dict[str, Any] = {"role": role}
    if expires_in is not None:
        spec["expiresIn"] = expires_in
    parse_resource({"apiVersion": API_VERSION, "kind": "Token", "metadata": {"name": name}, "spec": spec})
    created = _client(project).create_token(name, role=role, expires_in=expires_in, project=project)
    typer.echo(created["status"]["token"])
    typer.echo(f"{_ref('Token', name)} created (role {role}); store it now: it is not shown again", err=True)


@create_app.command("agent")
def create_agent(
    name: Annotated[str, typer.Argument(help="Name of the agent.")],
    system: Annotated[str, typer.Option("--system", help="The system prompt.")] = "",
    family: Annotated[
        list[str] | None,
        typer.Option("--family", help="Allowed Claude family (repeatable): haiku, sonnet, opus, fable."),
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="A Claude model id to pin.")] = None,
    max_cost: Annotated[
        str | None, typer.Option("--max-cost", help="Per-run model cost cap in USD, e.g. 0.50.")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", help="Output tokens per model call.")
    ] = None,
    api_key_secret: Annotated[
        str | None, typer.Option("--api-key-secret", help="Secret with ANTHROPIC_API_KEY (BYOK).")
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="NAME=VALUE, or NAME=secret:SECRET/KEY for a Secret's key (repeatable)."),
    ] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option("--allow-host", help="A host the run's commands may reach, e.g. pypi.org (repeatable)."),
    ] = None,
    project: ProjectOption = None,
) -> None:
    """Create an agent (it must not exist yet; use apply to change one)."""
    variables: dict[str, str | SecretKey] = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(
                f"--env takes NAME=VALUE or NAME=secret:SECRET/KEY, got {key[:40]!r} without '='"
            )
        if value.startswith("secret:"):
            secret, slash, secret_key = value.removeprefix("secret:").partition("/")
            if not slash or not secret or not secret_key:
                raise UsageError(f"--env {key}=secret:... needs SECRET/KEY, e.g. {key}=secret:db/PASSWORD")
            variables[key] = SecretKey(secret, secret_key)
        else:
            variables[key] = value
    spec = claude_agent_spec(
        system=system,
        families=family,
        model=model or None,
        max_tokens=max_tokens,
        per_run_max_cost=max_cost,
        api_key_secret=api_key_secret or None,
        env=variables,
        allowed_hosts=allow_host,
    )
    _create("Agent", "agents", name, spec, project)


@app.command()
def patch(
    target: TargetsArgument,
    patch_text: Annotated[
        str, typer.Option("--patch", help='A JSON merge patch, e.g. \'{"spec":{"state":"Stopped"}}\'.')
    ],
    project: ProjectOption = None,
) -> None:
    """Change a resource with a JSON merge patch."""
    try:
        body = json.loads(patch_text)
    except ValueError as exc:
        raise UsageError(f"--patch is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise UsageError("--patch must be a JSON object")
    client = _client(project)
    for kind, collection, name in _targets(target, need_name=True):
        assert name is not None
        client.patch(collection, name, body)
        typer.echo(f"{_ref(kind, name)} patched")


# -- get --------------------------------------------------------------------------------------


def _dollars(value: Any) -> str:
    return f"${value}" if value not in (None, "") else "-"


def _agent_row(agent: dict[str, Any], wide: bool) -> list[str]:
    spec, status, metadata = agent.get("spec") or {}, agent.get("status") or {}, agent.get("metadata") or {}
    model = spec.get("model") or {}
    families = ",".join(model.get("families") or []) or (model.get("name") or "all")
    row = [
        metadata.get("name", ""),
        str(status.get("revision", "-")),
        families,
        _dollars(spec.get("perRunMaxCostUSD")),
        spec.get("state") or "Running",
        format_age(metadata.get("creationTimestamp")),
    ]
    if wide:
        row += [model.get("access") or "Nodus", model.get("name") or "-", spec.get("image") or "-"]
    return row


def _run_row(run: dict[str, Any], wide: bool) -> list[str]:
    spec, status, metadata = run.get("spec") or {}, run.get("status") or {}, run.get("metadata") or {}
    turns = status.get("turns") or []
    row = [
        metadata.get("name", ""),
        spec.get("agent", ""),
        status.get("phase") or "Pending",
        status.get("reason") or "",
        (turns[-1].get("model") if turns else None) or "-",
        _dollars((status.get("cost") or {}).get("totalUSD")),
        format_age(metadata.get("creationTimestamp") or status.get("createdAt")),
    ]
    if wide:
        row += [
            str(status.get("agentRevision") or "-"),
            str(len(turns)),
            (status.get("sandbox") or {}).get("backend") or "-",
            "true" if spec.get("keepAlive") else "false",
        ]
    return row


def _group_cost(spec: dict[str, Any], status: dict[str, Any]) -> str:
    """``$0.012 / $0.60``: spent so far over the group's cap; just the spend when uncapped."""
    cost = status.get("cost") or {}
    spent = _dollars(cost.get("totalUSD") or "0")
    limit = cost.get("limitUSD") or spec.get("maxCostUSD")
    return f"{spent} / {_dollars(limit)}" if limit not in (None, "") else spent


def _blocked(status: dict[str, Any]) -> str:
    """``DependencyWait=1,MaxCostReached=2``: why queued runs wait, only the reasons that count."""
    reasons = status.get("blockedReasons") or {}
    text = ",".join(f"{reason}={count}" for reason, count in reasons.items() if count)
    return text or "-"


def _group_row(group: dict[str, Any], wide: bool) -> list[str]:
    spec, status, metadata = group.get("spec") or {}, group.get("status") or {}, group.get("metadata") or {}
    counts = status.get("counts") or {}
    row = [
        metadata.get("name", ""),
        spec.get("agent", ""),
        status.get("phase") or "Running",
        f"{counts.get('succeeded', 0)}/{counts.get('total', 0)}",
        str(counts.get("active", 0)),
        str(counts.get("queued", 0)),
        _group_cost(spec, status),
        format_age(metadata.get("creationTimestamp")),
    ]
    if wide:
        row += [
            str((spec.get("limits") or {}).get("maxActive") or 10),
            "true" if spec.get("sealed") else "false",
            status.get("reason") or "-",
            _blocked(status),
            _evaluation_text(status),
        ]
    return row


def _evaluation_text(status: dict[str, Any]) -> str:
    """``pass=7/10,unscored=2,pending=1``: an evaluation group's progress, in BLOCKED's style."""
    evaluation = status.get("evaluation")
    if not isinstance(evaluation, dict):
        return "-"
    text = f"pass={evaluation.get('passed', 0)}/{evaluation.get('scored', 0)}"
    for key in ("unscored", "pending"):
        if evaluation.get(key):
            text += f",{key}={evaluation[key]}"
    return text


def _environment_row(environment: dict[str, Any], wide: bool) -> list[str]:
    row = [
        f"{environment.get('owner', '')}/{environment.get('name', '')}",
        str(environment.get("version", "")),
        ",".join(environment.get("splits") or []),
        str(environment.get("maxTasks", "")),
        environment.get("description") or "",
    ]
    if wide:
        row.append(environment.get("image") or "-")
    return row


def _token_row(token: dict[str, Any], wide: bool) -> list[str]:
    metadata, spec, status = token.get("metadata") or {}, token.get("spec") or {}, token.get("status") or {}
    row = [
        metadata.get("name", ""),
        spec.get("role", ""),
        f"{status.get('prefix') or ''}...",
        status.get("expiresAt") or "never",
        format_age(metadata.get("creationTimestamp")),
    ]
    if wide:
        row.append(status.get("createdBy") or "-")
    return row


def _secret_row(secret: dict[str, Any], wide: bool) -> list[str]:
    metadata, status = secret.get("metadata") or {}, secret.get("status") or {}
    return [
        metadata.get("name", ""),
        secret.get("type") or "Opaque",
        ",".join(status.get("keys") or []),
        format_age(metadata.get("creationTimestamp")),
    ]


_TABLES: dict[str, tuple[list[str], list[str], Callable[[dict[str, Any], bool], list[str]]]] = {
    "Secret": (["NAME", "TYPE", "KEYS", "AGE"], [], _secret_row),
    "Token": (["NAME", "ROLE", "PREFIX", "EXPIRES", "AGE"], ["CREATED-BY"], _token_row),
    "Agent": (
        ["NAME", "REVISION", "FAMILIES", "MAX-COST", "STATE", "AGE"],
        ["ACCESS", "MODEL", "IMAGE"],
        _agent_row,
    ),
    "AgentRun": (
        ["NAME", "AGENT", "PHASE", "REASON", "MODEL", "COST", "AGE"],
        ["REVISION", "TURNS", "SANDBOX", "KEEP-ALIVE"],
        _run_row,
    ),
    "AgentGroup": (
        ["NAME", "AGENT", "PHASE", "RUNS", "ACTIVE", "QUEUED", "COST", "AGE"],
        ["MAX-ACTIVE", "SEALED", "REASON", "BLOCKED", "EVALUATION"],
        _group_row,
    ),
    "Environment": (["NAME", "VERSION", "SPLITS", "MAX-TASKS", "DESCRIPTION"], ["IMAGE"], _environment_row),
}

# Field selectors on agentruns the server also filters by (``?agent=``, ``?group=``).
_SERVER_FILTERS = {("spec", "agent"): "agent", ("spec", "group"): "group"}


def _field_selector(text: str) -> list[tuple[str, bool, str]]:
    """``spec.agent=x,status.phase!=Failed`` -> ``[(path, equal, value)]``."""
    selectors = []
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        match = re.fullmatch(r"([^=!]+?)\s*(==|!=|=)\s*(.*)", part)
        if match is None:
            raise UsageError(f"--field-selector {part!r} is not PATH=VALUE or PATH!=VALUE")
        path, operator, value = match.groups()
        try:
            jsonpath.parse(path)
        except jsonpath.JsonPathError as exc:
            raise UsageError(str(exc)) from None
        selectors.append((path, operator != "!=", value))
    return selectors


def _selected(resource: dict[str, Any], selectors: list[tuple[str, bool, str]]) -> bool:
    return all(
        (jsonpath.format_value(jsonpath.lookup(resource, path)) == value) == equal
        for path, equal, value in selectors
    )


def _print_resources(kind: str, items: list[dict[str, Any]], output: str | None, single: bool) -> None:
    if output in ("yaml", "json"):
        listed = {"apiVersion": API_VERSION, "kind": f"{kind}List", "items": items}
        value: Any = items[0] if single else listed
        typer.echo(dump_yaml(value) if output == "yaml" else dump_json(value), nl=output == "json")
    elif output == "name":
        for item in items:
            typer.echo(_ref(kind, (item.get("metadata") or {}).get("name", "")))
    elif output is not None and output.startswith("jsonpath="):
        expression = output.removeprefix("jsonpath=")
        for item in items:
            typer.echo(jsonpath.format_value(jsonpath.lookup(item, expression)))
    else:
        headers, wide_headers, row = _TABLES[kind]
        wide = output == "wide"
        print_table(headers + (wide_headers if wide else []), [row(item, wide) for item in items])


@app.command()
def get(
    target: Annotated[
        list[str],
        typer.Argument(help="KIND, KIND/NAME or KIND NAME.", metavar="KIND/NAME", show_default=False),
    ],
    output: OutputOption = None,
    field_selector: Annotated[
        str | None,
        typer.Option("--field-selector", help="Keep items whose PATH=VALUE, e.g. spec.group=batch-1."),
    ] = None,
    project: ProjectOption = None,
) -> None:
    """List resources of a kind, or show named ones."""
    known = output is None or output in ("yaml", "json", "wide", "name") or output.startswith("jsonpath=")
    if not known:
        raise UsageError(f"--output {output!r} is not one of yaml, json, wide, name, jsonpath={{...}}")
    if output is not None and output.startswith("jsonpath="):
        try:
            jsonpath.parse(output.removeprefix("jsonpath="))
        except jsonpath.JsonPathError as exc:
            raise UsageError(str(exc)) from None
    if target and SHORT_NAMES.get(target[0].strip().lower(), ("", ""))[1] == "environments":
        # Environment names hold a '/' themselves (owner/name@version): `get env nodus/python-fix`.
        _get_environments(_client(project), list(target[1:]), output)
        return
    targets = _targets(target, need_name=False)
    selectors = _field_selector(field_selector) if field_selector else []
    client = _client(project)
    kind, collection, _ = targets[0]
    if collection == "environments":
        _get_environments(client, [name for _, _, name in targets if name], output)
        return
    if targets[0][2] is None:
        params = {}
        for path, equal, value in selectors:
            server_filter = _SERVER_FILTERS.get(jsonpath.parse(path)) if collection == "agentruns" else None
            if server_filter and equal:
                params[server_filter] = value  # let the server filter too; the client-side check stays
        listed = client.list(collection, params=params or None)
        items = [item for item in listed if _selected(item, selectors)]
        if not items and output not in ("yaml", "json"):
            typer.echo(f"No {collection} found in project {project or _settings().project}.", err=True)
            return
        _print_resources(kind, items, output, single=False)
        return
    if len({t[0] for t in targets}) > 1:
        raise UsageError("name resources of one kind per `nodus get`")
    items = [client.get(collection, name) for _, _, name in targets if name is not None]
    selected = [item for item in items if _selected(item, selectors)]
    if not selected:  # every named resource exists, but the field selector left none
        typer.echo(f"No {collection} matched --field-selector.", err=True)
        return
    _print_resources(kind, selected, output, single=len(targets) == 1)


def _get_environments(client: Client, names: list[str], output: str | None) -> None:
    """Environments are named ``owner/name@version``; a name without the version lists every version."""
    items = client.environments()
    if names:
        wanted = set(names)
        items = [
            item
            for item in items
            if item.get("ref") in wanted or f"{item.get('owner')}/{item.get('name')}" in wanted
        ]
        found = {item.get("ref") for item in items} | {
            f"{item.get('owner')}/{item.get('name')}" for item in items
        }
        missing = sorted(wanted - found)
        if missing:
            raise NotFound(
                f"environment {missing[0]!r} is not installed on the server (`nodus get environments` "
                "lists those that are)",
                details={"kind": "Environment", "name": missing[0]},
            )
    if not items and output not in ("yaml", "json"):
        typer.echo("No environments are installed on the server.", err=True)
        return
    _print_resources("Environment", items, output, single=False)


# -- evaluation -------------------------------------------------------------------------------

evaluation_app = typer.Typer(help="Read an evaluation group's graded cases.", no_args_is_help=True)
app.add_typer(evaluation_app, name="evaluation")


def _case_row(record: dict[str, Any], wide: bool, repeated: bool) -> list[str]:
    case = str(record.get("taskId", ""))
    if repeated:
        case += f"#{record.get('repetition')}"
    reward = record.get("reward")
    row = [
        case,
        str(record.get("run", "")),
        str(record.get("state", "")),
        record.get("verdict") or "-",
        "-" if reward is None else f"{float(reward):g}",
    ]
    if wide:
        row += [record.get("reason") or "-", record.get("evidence") or "-"]
    return row


@evaluation_app.command("results")
def evaluation_results(
    name: Annotated[str, typer.Argument(help="The evaluation group.")],
    output: OutputOption = None,
    project: ProjectOption = None,
) -> None:
    """One line per case: task, run, state, verdict and reward (-o wide adds the grader's evidence)."""
    if output not in (None, "wide", "yaml", "json"):
        raise UsageError(f"--output {output!r} is not one of wide, yaml, json")
    answer = _client(project).group_results(name)
    items = list(answer.get("items") or [])
    if output in ("yaml", "json"):
        value = {
            "apiVersion": API_VERSION,
            "kind": "EvaluationResultList",
            "evaluation": answer.get("evaluation"),
            "items": items,
        }
        typer.echo(dump_yaml(value) if output == "yaml" else dump_json(value), nl=output == "json")
        return
    headers = ["CASE", "RUN", "STATE", "VERDICT", "REWARD"] + (
        ["REASON", "EVIDENCE"] if output == "wide" else []
    )
    repeated = any(int(item.get("repetition") or 1) > 1 for item in items)
    print_table(headers, [_case_row(item, output == "wide", repeated) for item in items])


# -- wait -------------------------------------------------------------------------------------


def _condition(text: str) -> tuple[str, tuple[str | int, ...], str | None]:
    """``delete`` or ``jsonpath={.a.b}=VALUE`` (the value optional) -> (mode, path, value)."""
    if text == "delete":
        return "delete", (), None
    if not text.startswith("jsonpath="):
        raise UsageError(f"--for={text!r}: use --for=jsonpath='{{.status.phase}}'=Succeeded or --for=delete")
    rest = text.removeprefix("jsonpath=")
    if rest.startswith("{"):
        end = rest.find("}")
        if end < 0:
            raise UsageError(f"--for={text!r}: the JSONPath has no closing brace")
        expression, tail = rest[: end + 1], rest[end + 1 :]
        if tail and not tail.startswith("="):
            raise UsageError(f"--for={text!r}: expected '=' after the JSONPath")
        value = tail[1:] if tail else None
    else:
        expression, separator, value_text = rest.partition("=")
        value = value_text if separator else None
    try:
        return "jsonpath", jsonpath.parse(expression), value
    except jsonpath.JsonPathError as exc:
        raise UsageError(str(exc)) from None


def _timeout(text: str) -> float:
    try:
        return parse_timeout(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--timeout") from None


def _path_text(path: tuple[str | int, ...]) -> str:
    return "{" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path) + "}"


@app.command()
def wait(
    target: TargetsArgument,
    for_: Annotated[str, typer.Option("--for", help="jsonpath='{.status.phase}'=Succeeded, or delete.")],
    timeout: Annotated[str, typer.Option("--timeout", help="Give up after this long: 30s, 2m, 1h.")] = "30s",
    project: ProjectOption = None,
) -> None:
    """Wait until a resource meets a condition, then print `KIND/NAME condition met`."""
    mode, path, expected = _condition(for_)
    seconds = _timeout(timeout)
    targets = _targets(target, need_name=True)
    client = _client(project)
    deadline = time.monotonic() + seconds
    for kind, collection, name in targets:
        assert name is not None
        _wait_one(client, kind, collection, name, mode, path, expected, deadline, timeout)
        typer.echo(f"{_ref(kind, name)} condition met")


def _wait_one(
    client: Client,
    kind: str,
    collection: str,
    name: str,
    mode: str,
    path: tuple[str | int, ...],
    expected: str | None,
    deadline: float,
    timeout_text: str,
) -> None:
    delay = 0.2
    last = "no answer yet"
    while True:
        try:
            resource = client.get(collection, name)
        except NotFound:
            if mode == "delete":
                return
            raise
        except Unavailable as exc:  # a restarting server is waited out until the timeout
            resource, last = None, exc.message
        if resource is not None and mode == "jsonpath":
            actual = jsonpath.lookup(resource, path)
            present = actual is not jsonpath.MISSING
            if present and (expected is None or jsonpath.format_value(actual) == expected):
                return
            last = f"{_path_text(path)} is {jsonpath.format_value(actual) or '<missing>'}"
            status = resource.get("status") or {}
            phase = status.get("phase")
            if (
                kind == "AgentRun"
                and path == ("status", "phase")
                and (phase in TERMINAL_PHASES or at_cost_cap(status))
            ):
                reason = f" ({status['reason']})" if status.get("reason") else ""
                message = f": {status['message']}" if status.get("message") else ""
                verb = "ended" if phase in TERMINAL_PHASES else "is parked"
                raise CliError(
                    f"{_ref(kind, name)} {verb} {phase}{reason}{message}; it will not become {expected}"
                )
            if kind == "AgentGroup" and path == ("status", "phase") and _group_settled(phase, expected):
                reason = f" ({status['reason']})" if status.get("reason") else ""
                message = f": {status['message']}" if status.get("message") else ""
                verb = "ended" if phase in GROUP_TERMINAL_PHASES else "is"
                raise CliError(
                    f"{_ref(kind, name)} {verb} {phase}{reason}{message}; it will not become {expected}"
                )
        elif resource is not None:
            last = "it still exists"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CliError(f"timed out after {timeout_text} waiting for {_ref(kind, name)}: {last}")
        time.sleep(min(delay, remaining))
        delay = min(delay * 1.5, 1.0)


def _group_settled(phase: Any, expected: str | None) -> bool:
    """The group can no longer reach ``expected``: it ended, or it is Cancelling (ends Cancelled)."""
    if phase in GROUP_TERMINAL_PHASES:
        return True
    return phase == "Cancelling" and expected not in ("Cancelling", "Cancelled")


# -- cancel / delete --------------------------------------------------------------------------


@app.command()
def cancel(
    target: TargetsArgument,
    project: ProjectOption = None,
) -> None:
    """Cancel runs (stop the command, delete the sandbox) or groups (every unfinished run)."""
    client = _client(project)
    targets = _targets(target, need_name=True)
    for kind, collection, _ in targets:
        if collection not in ("agentruns", "agentgroups"):
            raise UsageError(f"only agentruns and agentgroups can be cancelled, not {kind.lower()}s")
    for kind, collection, name in targets:
        assert name is not None
        if collection == "agentgroups":
            resource = client.cancel_group(name) or {}
            finished = GROUP_TERMINAL_PHASES
        else:
            resource = client.cancel_run(name) or {}
            finished = TERMINAL_PHASES
        phase = (resource.get("status") or {}).get("phase")
        if phase in finished and phase != "Cancelled":
            typer.echo(f"{_ref(kind, name)} already {phase}; nothing to cancel")
        else:
            typer.echo(f"{_ref(kind, name)} cancelled")


@app.command()
def delete(
    target: Annotated[
        list[str] | None,
        typer.Argument(help="KIND/NAME, or KIND NAME.", metavar="KIND/NAME", show_default=False),
    ] = None,
    filenames: Annotated[
        list[str] | None, typer.Option("--filename", "-f", help="Delete the resources of these files.")
    ] = None,
    ignore_not_found: Annotated[
        bool, typer.Option("--ignore-not-found", help="Treat a missing resource as deleted.")
    ] = False,
    project: ProjectOption = None,
) -> None:
    """Delete resources; a run is cancelled first, a group goes with all its runs, an agent only
    once no unfinished run uses it."""
    if target and filenames:
        raise UsageError("name resources as KIND/NAME or pass -f FILE, not both")
    if not target and not filenames:
        raise UsageError("name resources as KIND/NAME or KIND NAME, or pass -f FILE")
    if filenames:
        items = [
            (m.kind, m.collection, m.name, _manifest_project(m, project)) for m in load_manifests(filenames)
        ]
    else:
        items = [(k, c, n, project) for k, c, n in _targets(target or [], need_name=True) if n is not None]
    client = _client(project)
    for kind, collection, name, target_project in items:
        try:
            client.delete(collection, name, project=target_project)
        except NotFound:
            if not ignore_not_found:
                raise
            continue
        typer.echo(f"{_ref(kind, name)} {'revoked' if kind == 'Token' else 'deleted'}")


# -- login / logout / whoami ------------------------------------------------------------------


@app.command()
def login(
    token: Annotated[
        str, typer.Option("--token", help="An API token (nodus_...), e.g. from `nodus create token`.")
    ],
) -> None:
    """Check a token against the server and store it for that server (~/.nodus/credentials.json, 0600)."""
    settings = _settings()
    who = Client(settings=settings, token=token).whoami()
    project = None if who.get("project") == "*" else who.get("project")
    file = credentials.remember(settings.api_url, token, project=project)
    scope = "every project" if project is None else f"project {project}"
    typer.echo(
        f"logged in to {settings.api_url} as token {who.get('name')} ({scope}, role {who.get('role')}); "
        f"stored in {file}"
    )


@app.command()
def logout() -> None:
    """Forget the token stored for this server."""
    url = _settings().api_url
    typer.echo(f"removed the token of {url}" if credentials.forget(url) else f"no token was stored for {url}")


@app.command()
def whoami(output: OutputOption = None) -> None:
    """Which token this CLI uses: its name, project and role."""
    who = _client().whoami()
    if output == "json":
        typer.echo(dump_json(who))
    elif output == "yaml":
        typer.echo(dump_yaml(who), nl=False)
    else:
        scope = "every project (operator)" if who.get("project") == "*" else f"project {who.get('project')}"
        typer.echo(f"token {who.get('name')}: {scope}, role {who.get('role')}")


@app.command()
def console(project: ProjectOption = None) -> None:
    """Print the web console's link for the project, carrying this CLI's token.

    The token travels in the link's fragment (after ``#``), which a browser never sends to a
    server, so it reaches no access log; the page keeps it for its tab only.
    """
    settings = _settings()
    link = f"{settings.api_url}/console?{urlencode({'project': project or settings.project})}"
    typer.echo(f"{link}#token={quote(settings.token, safe='')}" if settings.token else link)


# -- credits ----------------------------------------------------------------------------------


def _print_credits(view: dict[str, Any]) -> None:
    typer.echo(f"project   {view.get('project')}")
    typer.echo(f"balance   ${view.get('balanceUSD')}")
    typer.echo(f"granted   ${view.get('grantedUSD')}")
    typer.echo(f"spent     ${view.get('spentUSD')}")
    typer.echo(f"reserved  ${view.get('reservedUSD')}  (held for calls in flight)")


@credits_app.callback()
def credits(ctx: typer.Context, output: OutputOption = None, project: ProjectOption = None) -> None:
    """Show the project's balance (runs on access Nodus are billed from it)."""
    if ctx.invoked_subcommand is not None:
        return
    view = _client(project).credits()
    if output == "json":
        typer.echo(dump_json(view))
    elif output == "yaml":
        typer.echo(dump_yaml(view), nl=False)
    else:
        _print_credits(view)


@credits_app.command("add")
def credits_add(
    amount: Annotated[str, typer.Argument(help="Dollars to add, e.g. 10 or 2.50.")],
    project: ProjectOption = None,
) -> None:
    """Add credits (the operator's verb); runs waiting for credits continue."""
    _print_credits(_client(project).add_credits(amount))


# -- agentrun answer / steps ------------------------------------------------------------------


@agentrun_app.command("answer")
def agentrun_answer(
    name: Annotated[str, typer.Argument(help="The run.")],
    project: ProjectOption = None,
) -> None:
    """Print the run's full answer."""
    text = str(_client(project).run_answer(name).get("answer") or "")
    typer.echo(text, nl=not text.endswith("\n"))


@agentrun_app.command("logs")
def agentrun_logs(
    name: Annotated[str, typer.Argument(help="The run.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the run ends.")] = False,
    project: ProjectOption = None,
) -> None:
    """Print the run's steps, phase changes, turns and answer; with -f, as they happen."""
    for event in _client(project).run_events(name, follow=follow):
        line = log_line(event)
        if line is None:
            continue
        if event.kind == "answer":  # chunks of one text: a newline only after the last
            typer.echo(line, nl=bool(event.data.get("final")) and not line.endswith("\n"))
        else:
            typer.echo(line)


@agentrun_app.command("send")
def agentrun_send(
    name: Annotated[str, typer.Argument(help="The keep-alive run.")],
    payload: Annotated[str, typer.Argument(help="The message text.")],
    key: Annotated[
        str | None, typer.Option("--key", help="A message key: the same key again is delivered once.")
    ] = None,
    project: ProjectOption = None,
) -> None:
    """Send a keep-alive run a message; it reads it after its current turn."""
    receipt = _client(project).send_message(name, payload, message_key=key)
    verb = "already delivered" if receipt.get("duplicate") else "sent"
    typer.echo(f"agentrun/{name} message {receipt.get('seq')} {verb}")


@agentrun_app.command("resolve")
def agentrun_resolve(
    name: Annotated[str, typer.Argument(help="The run waiting with NeedsResolution.")],
    step: Annotated[str, typer.Option("--step", help="The uncertain step (status.step).")],
    decision: Annotated[str, typer.Option("--decision", help="Completed, NoEffect or Cancelled.")],
    exit_code: Annotated[
        int | None, typer.Option("--exit-code", help="Completed: the command's exit code.")
    ] = None,
    output: Annotated[
        str | None, typer.Option("--output", help="Completed: what the command printed.")
    ] = None,
    evidence: Annotated[
        str | None, typer.Option("--evidence", help="Why you decided so (kept with the step).")
    ] = None,
    revision: Annotated[
        int | None,
        typer.Option("--revision", help="The run's metadata.resourceVersion you decided on (default: now)."),
    ] = None,
    project: ProjectOption = None,
) -> None:
    """Decide a step whose outcome is unknown; the run goes on (or fails, for Cancelled)."""
    if decision not in ("Completed", "NoEffect", "Cancelled"):
        raise UsageError(f"--decision {decision!r} is not one of Completed, NoEffect, Cancelled")
    if decision != "Completed" and (exit_code is not None or output is not None):
        raise UsageError("--exit-code and --output record a Completed command's result")
    client = _client(project)
    if revision is None:
        revision = int((client.get("agentruns", name).get("metadata") or {}).get("resourceVersion") or 0)
    body: dict[str, Any] = {"step": step, "decision": decision, "revision": revision}
    if decision == "Completed":
        body["result"] = {"exitCode": exit_code, "output": output or ""}
    if evidence is not None:
        body["evidence"] = evidence
    run = client.resolve_run(name, body)
    status = run.get("status") or {}
    typer.echo(f"agentrun/{name} step {step} resolved {decision}; phase {status.get('phase')}")


@agentrun_app.command("steps")
def agentrun_steps(
    name: Annotated[str, typer.Argument(help="The run.")],
    output: OutputOption = None,
    project: ProjectOption = None,
) -> None:
    """List what the run did, in order: sandbox, routing and model calls, commands, the answer."""
    if output not in (None, "yaml", "json", "wide"):
        raise UsageError(f"--output {output!r} is not one of yaml, json, wide")
    steps = _client(project).run_steps(name)
    if output == "yaml":
        typer.echo(dump_yaml({"items": steps}), nl=False)
        return
    if output == "json":
        typer.echo(dump_json({"items": steps}))
        return
    wide = output == "wide"
    headers = ["ID", "KIND", "STATE", "ATTEMPTS", "SUMMARY"] + (["COST"] if wide else [])
    rows = []
    for step in steps:
        summary = str(step.get("summary") or "")
        row = [
            str(step.get("id", "")),
            str(step.get("kind", "")),
            str(step.get("state", "")),
            str(step.get("attempts", "")),
            " ".join(summary.split()) if wide else shorten(summary, 80),
        ]
        if wide:
            row.append(_dollars(step.get("costUSD")))
        rows.append(row)
    if not rows:
        typer.echo(f"agentrun/{name} has no steps yet.", err=True)
        return
    print_table(headers, rows)


def run() -> NoReturn:
    """The ``nodus`` console script."""
    app(prog_name="nodus")
    raise SystemExit(0)  # pragma: no cover - the group's main always exits


if __name__ == "__main__":  # pragma: no cover
    run()
