"""``nodus create KIND NAME``: a resource from flags instead of a file.

Each verb builds the document the file would hold and validates it with `parse_resource`
before anything is sent, so a flag's refusal reads like the same field's refusal in a file.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any

import typer

from ..agent_spec import SecretKey, agent_param, claude_agent_spec
from ..handles import _run_name
from ..resources import API_VERSION, parse_resource
from . import root
from .root import ProjectOption, UsageError, ref

__all__ = ["create_app"]


create_app = typer.Typer(help="Create a resource from flags instead of a file.", no_args_is_help=True)


def _create(kind: str, collection: str, name: str, spec: dict[str, Any], project: str | None) -> None:
    manifest = {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name}, "spec": spec}
    parse_resource(manifest)
    root.client(project).create(collection, manifest)
    typer.echo(f"{ref(kind, name)} created")


@create_app.command("agentrun")
def create_agentrun(
    name: Annotated[
        str | None, typer.Argument(help="Name of the run (with --session-key: made up when left out).")
    ] = None,
    *,
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
    session_key: Annotated[
        str | None,
        typer.Option(
            "--session-key",
            help="Send the prompt to the live run of the agent holding this key (a DNS label), or "
            "start a keep-alive run that holds it.",
        ),
    ] = None,
    project: ProjectOption = None,
) -> None:
    """Start a run of an agent, alone or as a task of an AgentGroup.

    With --session-key the prompt goes to the session's live run as a message when there is
    one (it prints which run got it), and starts a keep-alive run holding the key otherwise.
    """
    if name is None:
        if session_key is None:
            raise UsageError("NAME is required (only a --session-key run gets a made-up name)")
        name = _run_name(agent, secrets.token_hex(4))
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
    if session_key is not None:
        spec.update({"sessionKey": session_key, "keepAlive": True})
        _submit_to_session(name, spec, project)
        return
    _create("AgentRun", "agentruns", name, spec, project)


def _submit_to_session(name: str, spec: dict[str, Any], project: str | None) -> None:
    """Create the session's run, or deliver the prompt to the live run holding the key."""
    manifest = {"apiVersion": API_VERSION, "kind": "AgentRun", "metadata": {"name": name}, "spec": spec}
    parse_resource(manifest)  # a bad --session-key is refused naming spec.sessionKey, nothing sent
    answer = root.client(project).create_result("agentruns", manifest)
    held = str((answer.resource.get("metadata") or {}).get("name") or name)
    key = spec["sessionKey"]
    if answer.result == "delivered":
        typer.echo(f"{ref('AgentRun', held)}: message delivered (session {key})")
    elif answer.result == "unchanged":
        typer.echo(f"{ref('AgentRun', held)} unchanged (session {key})")
    else:
        typer.echo(f"{ref('AgentRun', held)} created (session {key})")


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
    root.client(project).create("secrets", manifest)
    typer.echo(f"{ref('Secret', name)} created")


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
    created = root.client(project).create_token(name, role=role, expires_in=expires_in, project=project)
    typer.echo(created["status"]["token"])
    typer.echo(f"{ref('Token', name)} created (role {role}); store it now: it is not shown again", err=True)


def _flag(name: str) -> str:
    """The `nodus create agent` option of an agent setting, from the one table of them."""
    flag = agent_param(name).flag
    if flag is None:
        raise LookupError(f"{name} has no CLI flag in AGENT_PARAMS")
    return flag


def _help(name: str) -> str:
    return agent_param(name).help


@create_app.command("agent")
def create_agent(
    name: Annotated[str, typer.Argument(help="Name of the agent.")],
    system: Annotated[str, typer.Option(_flag("system"), help=_help("system"))] = "",
    family: Annotated[list[str] | None, typer.Option(_flag("families"), help=_help("families"))] = None,
    model: Annotated[str | None, typer.Option(_flag("model"), help=_help("model"))] = None,
    max_cost: Annotated[
        str | None, typer.Option(_flag("per_run_max_cost"), help=_help("per_run_max_cost"))
    ] = None,
    max_tokens: Annotated[int | None, typer.Option(_flag("max_tokens"), help=_help("max_tokens"))] = None,
    api_key_secret: Annotated[
        str | None, typer.Option(_flag("api_key_secret"), help=_help("api_key_secret"))
    ] = None,
    env: Annotated[list[str] | None, typer.Option(_flag("env"), help=_help("env"))] = None,
    allow_host: Annotated[
        list[str] | None, typer.Option(_flag("allowed_hosts"), help=_help("allowed_hosts"))
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
