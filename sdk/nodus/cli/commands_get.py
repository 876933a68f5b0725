"""``nodus get``: kubectl's tables of every kind, or the documents as YAML, JSON or a JSONPath.

One row function per kind (`_TABLES`); ``-o wide`` adds that kind's extra columns. Field
selectors are checked here on every item, and passed to the server too where it can filter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from ..client import Client
from ..errors import NotFound
from ..resources import API_VERSION, SHORT_NAMES
from . import jsonpath, listing, root
from .commands_webhook import WEBHOOK_TABLE
from .output import dollars, dump_json, dump_yaml, format_age, print_table
from .root import OutputOption, ProjectOption, UsageError, parse_targets, ref

__all__ = ["get"]


def _agent_row(agent: dict[str, Any], wide: bool) -> list[str]:
    spec, status, metadata = agent.get("spec") or {}, agent.get("status") or {}, agent.get("metadata") or {}
    model = spec.get("model") or {}
    families = ",".join(model.get("families") or []) or (model.get("name") or "all")
    row = [
        metadata.get("name", ""),
        str(status.get("revision", "-")),
        families,
        dollars(spec.get("perRunMaxCostUSD")),
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
        dollars((status.get("cost") or {}).get("totalUSD")),
        format_age(metadata.get("creationTimestamp") or status.get("createdAt")),
    ]
    if wide:
        row += [
            str(status.get("agentRevision") or "-"),
            str(len(turns)),
            (status.get("sandbox") or {}).get("backend") or "-",
            "true" if spec.get("keepAlive") else "false",
            dollars((status.get("cost") or {}).get("sandboxUSD") or "0"),
        ]
    return row


def _group_cost(spec: dict[str, Any], status: dict[str, Any]) -> str:
    """``$0.012 / $0.60``: spent so far over the group's cap; just the spend when uncapped."""
    cost = status.get("cost") or {}
    spent = dollars(cost.get("totalUSD") or "0")
    limit = cost.get("limitUSD") or spec.get("maxCostUSD")
    return f"{spent} / {dollars(limit)}" if limit not in (None, "") else spent


def _blocked(status: dict[str, Any]) -> str:
    """``DependencyWait=1,NeedsResolution=1``: why queued runs wait, and how many started runs
    wait for a person (NeedsResolution); only the reasons that count."""
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
        str(counts.get("waiting", 0)),
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


def _budget_row(budget: dict[str, Any], wide: bool) -> list[str]:
    metadata, spec, status = (
        budget.get("metadata") or {},
        budget.get("spec") or {},
        budget.get("status") or {},
    )
    row = [
        metadata.get("name", ""),
        dollars(spec.get("maxCostUSD")),
        spec.get("period") or "total",
        dollars(status.get("spentUSD")),
        dollars(status.get("leftUSD")),
        format_age(metadata.get("creationTimestamp")),
    ]
    if wide:
        row += [dollars(status.get("reservedUSD")), status.get("periodEnd") or "-"]
    return row


_TABLES: dict[str, tuple[list[str], list[str], Callable[[dict[str, Any], bool], list[str]]]] = {
    "Budget": (
        ["NAME", "MAX-COST", "PERIOD", "SPENT", "LEFT", "AGE"],
        ["RESERVED", "PERIOD-END"],
        _budget_row,
    ),
    "Secret": (["NAME", "TYPE", "KEYS", "AGE"], [], _secret_row),
    "Webhook": WEBHOOK_TABLE,
    "Token": (["NAME", "ROLE", "PREFIX", "EXPIRES", "AGE"], ["CREATED-BY"], _token_row),
    "Agent": (
        ["NAME", "REVISION", "FAMILIES", "MAX-COST", "STATE", "AGE"],
        ["ACCESS", "MODEL", "IMAGE"],
        _agent_row,
    ),
    "AgentRun": (
        ["NAME", "AGENT", "PHASE", "REASON", "MODEL", "COST", "AGE"],
        ["REVISION", "TURNS", "SANDBOX", "KEEP-ALIVE", "SANDBOX-COST"],
        _run_row,
    ),
    "AgentGroup": (
        ["NAME", "AGENT", "PHASE", "RUNS", "ACTIVE", "WAITING", "QUEUED", "COST", "AGE"],
        ["MAX-ACTIVE", "SEALED", "REASON", "BLOCKED", "EVALUATION"],
        _group_row,
    ),
    "Environment": (["NAME", "VERSION", "SPLITS", "MAX-TASKS", "DESCRIPTION"], ["IMAGE"], _environment_row),
}


def _print_resources(
    kind: str,
    items: list[dict[str, Any]],
    output: str | None,
    single: bool,
    meta: dict[str, Any] | None = None,
) -> None:
    if output in ("yaml", "json"):
        listed = {"apiVersion": API_VERSION, "kind": f"{kind}List", "metadata": meta or {}, "items": items}
        value: Any = items[0] if single else listed
        typer.echo(dump_yaml(value) if output == "yaml" else dump_json(value), nl=output == "json")
    elif output == "name":
        for item in items:
            typer.echo(ref(kind, (item.get("metadata") or {}).get("name", "")))
    elif output is not None and output.startswith("jsonpath="):
        expression = output.removeprefix("jsonpath=")
        for item in items:
            typer.echo(jsonpath.format_value(jsonpath.lookup(item, expression)))
    else:
        headers, wide_headers, row = _TABLES[kind]
        wide = output == "wide"
        print_table(headers + (wide_headers if wide else []), [row(item, wide) for item in items])


def get(
    target: Annotated[
        list[str],
        typer.Argument(help="KIND, KIND/NAME or KIND NAME.", metavar="KIND/NAME", show_default=False),
    ],
    output: OutputOption = None,
    field_selector: Annotated[
        str | None,
        typer.Option(
            "--field-selector",
            help="FIELD=VALUE, FIELD!=VALUE, a comma is AND: status.phase, status.reason, spec.agent, "
            "spec.group, metadata.creationTimestamp>=TIME filter on the server; other paths here.",
        ),
    ] = None,
    selector: Annotated[
        str | None,
        typer.Option("--selector", "-l", help="Labels: k=v, k!=v, 'k in (a,b)', 'k notin (a,b)', k, !k."),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", help="One page of at most N (1-1000); the next page's token on stderr."),
    ] = None,
    continue_: Annotated[
        str | None, typer.Option("--continue", help="The token --limit printed: the next page.")
    ] = None,
    project: ProjectOption = None,
) -> None:
    """List resources of a kind (every page, or one with --limit), or show named ones."""
    known = output is None or output in ("yaml", "json", "wide", "name") or output.startswith("jsonpath=")
    if not known:
        raise UsageError(f"--output {output!r} is not one of yaml, json, wide, name, jsonpath={{...}}")
    if output is not None and output.startswith("jsonpath="):
        try:
            jsonpath.parse(output.removeprefix("jsonpath="))
        except jsonpath.JsonPathError as exc:
            raise UsageError(str(exc)) from None
    environments = bool(target) and SHORT_NAMES.get(target[0].strip().lower(), ("", ""))[1] == "environments"
    if environments:
        _refuse_selection_of_environments(selector, field_selector, limit, continue_)
        # Environment names hold a '/' themselves (owner/name@version): `get env nodus/python-fix`.
        _get_environments(root.client(project), list(target[1:]), output)
        return
    targets = parse_targets(target, need_name=False)
    kind, collection, _ = targets[0]
    if collection == "environments":
        _refuse_selection_of_environments(selector, field_selector, limit, continue_)
        _get_environments(root.client(project), [name for _, _, name in targets if name], output)
        return
    selection = listing.selection_of(collection, selector, field_selector)
    client = root.client(project)
    if targets[0][2] is None:
        listed = listing.fetch(client, collection, selection, limit=limit, continue_=continue_)
        meta: dict[str, Any] = {"continue": listed.continue_} if listed.continue_ else {}
        if listed.remaining_item_count is not None:
            meta["remainingItemCount"] = listed.remaining_item_count
        if not listed.items and output not in ("yaml", "json"):
            typer.echo(f"No {collection} found in project {project or root.settings().project}.", err=True)
        else:
            _print_resources(kind, listed.items, output, single=False, meta=meta)
        if listed.continue_:  # as kubectl: the rest is a page away, said where it does not mix with the items
            more = listed.remaining_item_count
            typer.echo(f"{more} more; next page: --continue {listed.continue_}", err=True)
        return
    if limit is not None or continue_:
        raise UsageError("--limit and --continue page a list; they do not apply to named resources")
    if len({t[0] for t in targets}) > 1:
        raise UsageError("name resources of one kind per `nodus get`")
    items = [client.get(collection, name) for _, _, name in targets if name is not None]
    selected = [item for item in items if selection.matches(item)]
    if not selected:  # every named resource exists, but a selector left none
        typer.echo(f"No {collection} matched the selectors.", err=True)
        return
    _print_resources(kind, selected, output, single=len(targets) == 1)


def _refuse_selection_of_environments(
    selector: str | None, field_selector: str | None, limit: int | None, continue_: str | None
) -> None:
    """Environments are the server's installed task sets, not resources: no labels, no fields to
    select on, no pages. A selector is refused rather than ignored (ignored, it lists them all)."""
    given = [
        flag
        for flag, value in (
            ("--selector", selector),
            ("--field-selector", field_selector),
            ("--limit", limit),
            ("--continue", continue_),
        )
        if value is not None
    ]
    if given:
        raise UsageError(
            f"{given[0]} does not apply to environments (they have no labels, fields or pages); "
            "`nodus get environments` lists every installed one"
        )


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
