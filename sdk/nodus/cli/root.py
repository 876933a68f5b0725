"""The root of the ``nodus`` command line: the typer app, its one-line error promise, the shared
options, and the settings and client every command uses.

Every failure ends as exactly one ``error: <Code>: <message>`` line on stderr and a non-zero
exit code (2 for usage mistakes, 1 for everything else), never a traceback: the CLI is used from
scripts and CI logs where a stack trace hides the one sentence that matters. ``<Code>`` is what
a script tells refusals apart by, kubectl-style: the API's reason name for a refusal
(``AgentStopped``, ``AgentRunFinished``, ``NotFound``, ``Invalid``...: `nodus.errors.NodusError`'s
``code``), a run's reason when ``wait`` can no longer be met, and for the CLI's own failures
``UsageError``, ``Aborted``, the OS error's name (``FileNotFoundError``), ``Unavailable`` or
``InternalError``. ``NODUS_DEBUG=1`` re-raises unexpected exceptions for developers.

Commands call `client` and `settings` through this module (``root.client(project)``), so a
test replaces the client of every command in one place. Nothing here imports Ray.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import typer
import yaml
from typer.core import TyperGroup

from ..client import Client
from ..config import ENV_API_URL, ENV_PROJECT, Settings, load_settings
from ..errors import NodusError
from ..resources import SHORT_NAMES

__all__ = [
    "app",
    "CliError",
    "UsageError",
    "ClickException",
    "KIND_HELP",
    "ProjectOption",
    "TargetsArgument",
    "OutputOption",
    "settings",
    "client",
    "parse_kind",
    "parse_targets",
    "ref",
]

# Typer 0.2x ships its own copy of click (``typer._click``) while older releases use the click
# package; usage errors must be caught as the classes *this* typer raises, so take them from it.
_CLICK = typer.BadParameter.__module__.rpartition(".")[0]
_click_exceptions: Any = importlib.import_module(f"{_CLICK}.exceptions")
_click_globals: Any = importlib.import_module(f"{_CLICK}.globals")
if TYPE_CHECKING:  # the click package has the same classes, with types
    from click.exceptions import ClickException, UsageError
else:
    UsageError = _click_exceptions.UsageError
    ClickException = _click_exceptions.ClickException
_ABORTS: tuple[type[BaseException], ...] = tuple(
    {typer.Abort, getattr(_click_exceptions, "Abort", typer.Abort)}
)
_NO_ARGS_HELP: Any = getattr(_click_exceptions, "NoArgsIsHelpError", ())  # click >= 8.2

_SETTINGS = "nodus.settings"
KIND_HELP = (
    "agent (agents), agentrun (agentruns, ar), agentgroup (agentgroups, ag), secret (secrets), "
    "environment (environments, env)"
)


class CliError(ClickException):
    """A failure the CLI reports as one line, with its own exit code and the ``reason`` code the
    line names (``error: <reason>: <message>``)."""

    def __init__(self, message: str, exit_code: int = 1, *, reason: str = "Failed") -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc,unused-ignore]  # a ClassVar in click's stubs
        self.reason = reason


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _describe(exc: NodusError) -> str:
    """The message of ``error: <code>: <message>``, naming the field when the message does not."""
    message = exc.message if exc.message and exc.message != exc.code else ""
    field = exc.details.get("field") if isinstance(exc.details, dict) else None
    if field and str(field) not in message:
        message = f"{message} (field: {field})" if message else f"field: {field}"
    return message


class _NodusGroup(TyperGroup):
    """The root command: turns every exception into one ``error: <Code>: ...`` line and an exit code."""

    def main(  # type: ignore[override,unused-ignore]
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
            code = _report("UsageError", exc.format_message() + hint, exc.exit_code)
        except ClickException as exc:
            reason = exc.reason if isinstance(exc, CliError) else "UsageError"
            code = _report(reason, exc.format_message(), exc.exit_code)
        except _ABORTS:
            code = _report("Aborted", "aborted", 130)
        except NodusError as exc:
            code = _report(exc.code, _describe(exc), 1)
        except yaml.YAMLError as exc:
            code = _report("Invalid", f"malformed YAML: {exc}", 1)
        except OSError as exc:
            where = f": {exc.filename}" if exc.filename else ""
            code = _report(type(exc).__name__, f"{exc.strerror or exc}{where}", 1)
        except httpx.HTTPError as exc:
            code = _report("Unavailable", f"HTTP error: {exc}", 1)
        except Exception as exc:  # the promise is one line, whatever went wrong
            if os.environ.get("NODUS_DEBUG"):
                raise
            code = _report(
                "InternalError",
                f"unexpected {type(exc).__name__}: {exc} (set NODUS_DEBUG=1 for a traceback)",
                1,
            )
        if standalone_mode:
            sys.exit(code)
        return code


def _report(reason: str, message: str, code: int) -> int:
    """Print ``error: <reason>: <message>`` (one line) and return the exit code."""
    reason = _one_line(reason).replace(" ", "") or "Failed"
    text = _one_line(message)
    typer.echo(f"error: {reason}: {text}" if text else f"error: {reason}", err=True)
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

# Options every command that names resources takes.
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


def settings() -> Settings:
    """The settings of this invocation: the root options over the environment and config file."""
    ctx = _click_globals.get_current_context(silent=True)
    found = ctx.meta.get(_SETTINGS) if ctx is not None else None
    return found or load_settings()


def client(project: str | None = None) -> Client:
    """The API client of this invocation, for ``project`` (default: the settings' project)."""
    return Client(settings=settings(), project=project)


# -- kinds and targets ------------------------------------------------------------------------


def parse_kind(text: str) -> tuple[str, str]:
    """``ar`` -> ``("AgentRun", "agentruns")``; an unknown kind is a usage error."""
    key = text.strip().lower()
    if key in SHORT_NAMES:
        return SHORT_NAMES[key]
    raise UsageError(f"unknown kind {text!r}; known kinds: {KIND_HELP}")


def parse_targets(args: Sequence[str], *, need_name: bool) -> list[tuple[str, str, str | None]]:
    """``KIND/NAME ...`` or ``KIND [NAME ...]`` -> ``[(kind, collection, name | None)]``."""
    if not args:
        raise UsageError(f"name a kind ({KIND_HELP}), as KIND/NAME or KIND NAME")
    if "/" in args[0]:
        targets: list[tuple[str, str, str | None]] = []
        for arg in args:
            kind_text, _, name = arg.partition("/")
            if not name:
                raise UsageError(f"{arg!r} names no resource; write KIND/NAME")
            targets.append((*parse_kind(kind_text), name))
        return targets
    kind, collection = parse_kind(args[0])
    names = list(args[1:])
    if any("/" in name for name in names):
        raise UsageError("mix of KIND NAME and KIND/NAME; write one form")
    if not names:
        if need_name:
            raise UsageError(f"name the {kind} as {kind.lower()}/NAME or {kind.lower()} NAME")
        return [(kind, collection, None)]
    return [(kind, collection, name) for name in names]


def ref(kind: str, name: str) -> str:
    """``agentrun/NAME``: how every command names a resource it acted on."""
    return f"{kind.lower()}/{name}"
