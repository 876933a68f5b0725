"""Verbs on runs and groups that are going: ``wait``, ``cancel`` and ``nodus agentrun ...``
(answer, logs, send, resolve, steps).

``wait`` polls until a condition holds and stops early, with the run's reason, once the
condition can no longer hold (a run that ended otherwise, or is parked at its cost cap).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from ..client import Client
from ..durations import parse_timeout
from ..errors import NotFound, Unavailable
from ..events import log_line
from ..resources import GROUP_TERMINAL_PHASES, TERMINAL_PHASES, at_cost_cap
from . import jsonpath, root
from .output import dollars, dump_json, dump_yaml, print_table, step_summary
from .root import CliError, OutputOption, ProjectOption, TargetsArgument, UsageError, parse_targets, ref

__all__ = ["wait", "cancel", "agentrun_app"]


_PROGRAM_LOG_POLL_SECONDS = 0.5

agentrun_app = typer.Typer(
    help="Read a run's answer and steps; send a keep-alive run a message.", no_args_is_help=True
)


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


def wait(
    target: TargetsArgument,
    for_: Annotated[str, typer.Option("--for", help="jsonpath='{.status.phase}'=Succeeded, or delete.")],
    timeout: Annotated[str, typer.Option("--timeout", help="Give up after this long: 30s, 2m, 1h.")] = "30s",
    project: ProjectOption = None,
) -> None:
    """Wait until a resource meets a condition, then print `KIND/NAME condition met`."""
    mode, path, expected = _condition(for_)
    seconds = _timeout(timeout)
    targets = parse_targets(target, need_name=True)
    client = root.client(project)
    deadline = time.monotonic() + seconds
    for kind, collection, name in targets:
        assert name is not None
        _wait_one(client, kind, collection, name, mode, path, expected, deadline, timeout)
        typer.echo(f"{ref(kind, name)} condition met")


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
                    f"{ref(kind, name)} {verb} {phase}{reason}{message}; it will not become {expected}",
                    reason=str(status.get("reason") or phase),  # what a script tells apart
                )
            if kind == "AgentGroup" and path == ("status", "phase") and _group_settled(phase, expected):
                reason = f" ({status['reason']})" if status.get("reason") else ""
                message = f": {status['message']}" if status.get("message") else ""
                verb = "ended" if phase in GROUP_TERMINAL_PHASES else "is"
                raise CliError(
                    f"{ref(kind, name)} {verb} {phase}{reason}{message}; it will not become {expected}",
                    reason=str(status.get("reason") or phase),
                )
        elif resource is not None:
            last = "it still exists"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CliError(
                f"timed out after {timeout_text} waiting for {ref(kind, name)}: {last}", reason="WaitTimeout"
            )
        time.sleep(min(delay, remaining))
        delay = min(delay * 1.5, 1.0)


def _group_settled(phase: Any, expected: str | None) -> bool:
    """The group can no longer reach ``expected``: it ended, or it is Cancelling (ends Cancelled)."""
    if phase in GROUP_TERMINAL_PHASES:
        return True
    return phase == "Cancelling" and expected not in ("Cancelling", "Cancelled")


# -- cancel -----------------------------------------------------------------------------------


def cancel(
    target: TargetsArgument,
    project: ProjectOption = None,
) -> None:
    """Cancel runs (stop the command, delete the sandbox) or groups (every unfinished run)."""
    client = root.client(project)
    targets = parse_targets(target, need_name=True)
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
            typer.echo(f"{ref(kind, name)} already {phase}; nothing to cancel")
        else:
            typer.echo(f"{ref(kind, name)} cancelled")


# -- agentrun ---------------------------------------------------------------------------------


@agentrun_app.command("answer")
def agentrun_answer(
    name: Annotated[str, typer.Argument(help="The run.")],
    project: ProjectOption = None,
) -> None:
    """Print the run's full answer."""
    text = str(root.client(project).run_answer(name).get("answer") or "")
    typer.echo(text, nl=not text.endswith("\n"))


@agentrun_app.command("logs")
def agentrun_logs(
    name: Annotated[str, typer.Argument(help="The run.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the run ends.")] = False,
    project: ProjectOption = None,
) -> None:
    """Print the run's steps, phase changes, turns and answer (a Python run's: what its program
    printed); with -f, as they happen."""
    client = root.client(project)
    if (client.get("agentruns", name).get("status") or {}).get("program") == "Python":
        _program_logs(client, name, follow)
        return
    for event in client.run_events(name, follow=follow):
        line = log_line(event)
        if line is None:
            continue
        if event.kind == "answer":  # chunks of one text: a newline only after the last
            typer.echo(line, nl=bool(event.data.get("final")) and not line.endswith("\n"))
        else:
            typer.echo(line)


def _program_logs(client: Client, name: str, follow: bool) -> None:
    """A Python run's program log; with ``follow``, read again until the run ends."""
    shown = 0
    while True:
        done = (
            not follow or (client.get("agentruns", name).get("status") or {}).get("phase") in TERMINAL_PHASES
        )
        text = client.run_logs(name)
        complete = text if done else text[: text.rfind("\n") + 1]
        if len(complete) > shown:
            typer.echo(complete[shown:], nl=False)
            shown = len(complete)
        if done:
            if complete and not complete.endswith("\n"):
                typer.echo("")
            return
        time.sleep(_PROGRAM_LOG_POLL_SECONDS)


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
    receipt = root.client(project).send_message(name, payload, message_key=key)
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
    checkpoint_seq: Annotated[
        int | None,
        typer.Option(
            "--checkpoint-seq",
            help="The journal seq you decided on (the last step's SEQ); refused if the run moved on.",
        ),
    ] = None,
    project: ProjectOption = None,
) -> None:
    """Decide a step whose outcome is unknown; the run goes on (or fails, for Cancelled)."""
    if decision not in ("Completed", "NoEffect", "Cancelled"):
        raise UsageError(f"--decision {decision!r} is not one of Completed, NoEffect, Cancelled")
    if decision != "Completed" and (exit_code is not None or output is not None):
        raise UsageError("--exit-code and --output record a Completed command's result")
    client = root.client(project)
    if revision is None:
        revision = int((client.get("agentruns", name).get("metadata") or {}).get("resourceVersion") or 0)
    body: dict[str, Any] = {"step": step, "decision": decision, "revision": revision}
    if decision == "Completed":
        body["result"] = {"exitCode": exit_code, "output": output or ""}
    if evidence is not None:
        body["evidence"] = evidence
    if checkpoint_seq is not None:
        body["checkpointSeq"] = checkpoint_seq
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
    steps = root.client(project).run_steps(name)
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
        row = [
            str(step.get("id", "")),
            str(step.get("kind", "")),
            str(step.get("state", "")),
            str(step.get("attempts", "")),
            step_summary(step, None if wide else 80),  # a step in progress: what, for how long
        ]
        if wide:
            row.append(dollars(step.get("costUSD")))
        rows.append(row)
    if not rows:
        typer.echo(f"agentrun/{name} has no steps yet.", err=True)
        return
    print_table(headers, rows)
