"""``nodus webhook create|deliveries|test``, and the rows ``nodus get webhooks`` prints.

A Webhook is applied, listed and deleted as every kind (``nodus apply -f webhook.yaml``,
``nodus get webhooks``, ``nodus delete webhook NAME``); these verbs add what is its own: creating
one with a generated signing secret (printed once, kept only in a project Secret), the
deliveries with every attempt, and a test event. Each failure is one ``error:`` line and a
non-zero exit (`root`), as for every verb.
"""

from __future__ import annotations

import base64
import secrets
from typing import Annotated, Any

import typer

from ..client_webhooks import webhook_document
from ..resources import API_VERSION, parse_resource
from ..schema_webhook import WEBHOOK_EVENTS
from . import root
from .output import dump_json, dump_yaml, format_age, print_table
from .root import ProjectOption, UsageError, ref

__all__ = [
    "webhook_app",
    "webhook_create",
    "webhook_deliveries",
    "webhook_test",
    "webhook_row",
    "WEBHOOK_TABLE",
]

webhook_app = typer.Typer(help="Webhooks: create one, its deliveries, a test event.", no_args_is_help=True)

_SECRET_KEY = "signingSecret"


def webhook_row(webhook: dict[str, Any], wide: bool) -> list[str]:
    metadata, spec, status = (
        webhook.get("metadata") or {},
        webhook.get("spec") or {},
        webhook.get("status") or {},
    )
    events = spec.get("events") or []
    row = [
        metadata.get("name", ""),
        spec.get("url", ""),
        "all" if len(events) == len(WEBHOOK_EVENTS) else ",".join(events),
        spec.get("group") or "-",
        format_age(status.get("lastSuccessAt")) if status.get("lastSuccessAt") else "-",
        str(status.get("consecutiveFailures") or 0),
        str(status.get("pending") or 0),
        format_age(metadata.get("creationTimestamp")),
    ]
    if wide:
        secret_ref = spec.get("secretRef") or {}
        row += [f"{secret_ref.get('name', '')}/{secret_ref.get('key', '')}", status.get("lastError") or "-"]
    return row


WEBHOOK_TABLE = (
    ["NAME", "URL", "EVENTS", "GROUP", "LAST-SUCCESS", "FAILING", "PENDING", "AGE"],
    ["SECRET", "LAST-ERROR"],
    webhook_row,
)


@webhook_app.command("create")
def webhook_create(
    name: Annotated[str, typer.Argument(help="Name of the webhook.")],
    url: Annotated[str, typer.Option("--url", help="Where to POST events: an http(s) URL.")],
    event: Annotated[
        list[str] | None,
        typer.Option(
            "--event", help="An event type (repeatable; default all): run.succeeded, run.waiting..."
        ),
    ] = None,
    group: Annotated[
        str | None, typer.Option("--group", help="Only this AgentGroup's runs and itself.")
    ] = None,
    secret: Annotated[
        str | None,
        typer.Option(
            "--secret", help="A Secret holding a whsec_ key (default: generate one, print it once)."
        ),
    ] = None,
    key: Annotated[
        str, typer.Option("--key", help="The Secret's key holding the signing secret.")
    ] = _SECRET_KEY,
    project: ProjectOption = None,
) -> None:
    """Create a Webhook; without --secret, a new signing secret is made, kept in Secret
    NAME-signing and printed this once (verify deliveries with it)."""
    client = root.client(project)
    generated = None
    secret_name = secret or f"{name}-signing"
    document = webhook_document(name, url, secret=secret_name, key=key, events=event, group=group)
    parse_resource(document)  # a bad URL or event is refused before anything is created
    if secret is None:
        generated = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")
        manifest = {
            "apiVersion": API_VERSION,
            "kind": "Secret",
            "metadata": {"name": secret_name},
            "stringData": {key: generated},
        }
        client.create("secrets", manifest)
    try:
        client.create("webhooks", document)
    except Exception:
        if generated is not None:  # the secret would be left behind, unused
            client.delete("secrets", secret_name)
        raise
    typer.echo(f"{ref('Webhook', name)} created")
    if generated is not None:
        typer.echo(f"signing secret (shown once; kept in secret/{secret_name}): {generated}")


@webhook_app.command("deliveries")
def webhook_deliveries(
    name: Annotated[str, typer.Argument(help="The webhook.")],
    limit: Annotated[int, typer.Option("--limit", help="At most this many, newest first (1-200).")] = 20,
    output: Annotated[str | None, typer.Option("--output", "-o", help="yaml or json.")] = None,
    project: ProjectOption = None,
) -> None:
    """Each event owed to the webhook, newest first: its state and attempts."""
    if output not in (None, "yaml", "json"):
        raise UsageError(f"--output {output!r} is not one of yaml, json")
    items = root.client(project).webhook_deliveries(name, limit=limit, project=project)
    if output is not None:
        listed = {"apiVersion": API_VERSION, "kind": "WebhookDeliveryList", "items": items}
        typer.echo(dump_yaml(listed) if output == "yaml" else dump_json(listed), nl=output == "json")
        return
    if not items:
        typer.echo(f"No deliveries for webhook {name} yet.", err=True)
        return
    rows = []
    for item in items:
        attempts = item.get("attempts") or []
        last = attempts[-1] if attempts else {}
        rows.append(
            [
                item.get("eventId", ""),
                item.get("eventType", ""),
                item.get("state", ""),
                str(len(attempts)),
                str(last.get("statusCode") or "-"),
                (last.get("error") or "-")[:60],
                item.get("nextAttemptAt") or "-",
                format_age(item.get("createdAt")),
            ]
        )
    print_table(["EVENT-ID", "TYPE", "STATE", "ATTEMPTS", "STATUS", "ERROR", "NEXT-ATTEMPT", "AGE"], rows)


@webhook_app.command("test")
def webhook_test(
    name: Annotated[str, typer.Argument(help="The webhook.")],
    project: ProjectOption = None,
) -> None:
    """Send a webhook.test event now (signed, recorded and retried like any other)."""
    record = root.client(project).send_webhook_test(name, project=project)
    typer.echo(f"webhook.test {record.get('eventId', '')} queued; see `nodus webhook deliveries {name}`")
