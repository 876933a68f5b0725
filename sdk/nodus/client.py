"""The HTTP client for the nodus REST API (docs/api.md).

The SDK and the CLI talk to the server only through this module, over plain HTTP, so a machine
with just the SDK installed never needs Ray. Every refusal comes back as the `errors` class the
server raised (rebuilt from ``{code, message, details}``), and every transport failure becomes one
`errors.Unavailable` that says which URL could not be reached; a token never appears in either.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple, cast
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from .client_export import ExportCalls
from .client_fork import ForkCalls
from .client_listing import ListingCalls
from .client_statistics import StatisticsCalls
from .client_webhooks import WebhookCalls
from .config import Settings, load_settings
from .errors import Invalid, NodusError, Unavailable, error_from_response
from .events import RunEvent, follow_events
from .resources import API_VERSION, validate_dns_label

__all__ = ["COLLECTIONS", "Applied", "Client"]

# The REST collections this server serves; the CLI maps kinds onto these.
COLLECTIONS: frozenset[str] = frozenset(
    {
        "agents",
        "agentruns",
        "agentgroups",
        "secrets",
        "credits",
        "environments",
        "tokens",
        "agentsources",
        "budgets",
        "webhooks",
    }
)

# Only connection failures of idempotent GETs are retried: the request never reached the server,
# so a retry cannot double an effect. Writes are left to the caller, who knows whether the
# operation is safe to repeat (apply is; create is not).
_GET_RETRY_DELAYS: tuple[float, ...] = (0.2, 0.5)
# A write made safe to repeat by its idempotency key waits out a replaced API replica (seconds).
_IDEMPOTENT_WRITE_RETRY_DELAYS: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0, 4.0)
_DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
# A 429 means the API shed the request before doing anything: any request may be sent again,
# after Retry-After (capped), for up to this long in all.
_SHED_RETRY_BUDGET_SECONDS = 120.0
_SHED_RETRY_AFTER_CAP_SECONDS = 10.0


class Applied(NamedTuple):
    """The answer to an apply (PUT): the stored resource, and whether this call created it."""

    resource: dict[str, Any]
    created: bool
    # "created", "configured" or "unchanged" as the server decided it (X-Nodus-Result), if said.
    result: str | None = None


def _retry_after(response: httpx.Response) -> float | None:
    """How long to wait before sending a shed request (429) again; None for any other answer."""
    if response.status_code != 429:
        return None
    try:
        seconds = float(response.headers.get("Retry-After", "1"))
    except ValueError:  # an HTTP date, or nonsense: a second is a fair guess
        seconds = 1.0
    return min(max(seconds, 0.05), _SHED_RETRY_AFTER_CAP_SECONDS)


def _display_url(url: str) -> str:
    """The URL without user-info or query, so credentials embedded in it never reach a message."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _segment(value: str, what: str) -> str:
    """One URL path segment, quoted, refusing values that would change the path's meaning."""
    if not isinstance(value, str) or value in ("", ".", ".."):
        raise Invalid(f"{what} {value!r} is not a valid name", details={"field": what})
    return quote(value, safe="")


def _name(value: str) -> str:
    try:
        validate_dns_label(value)
    except ValueError as exc:
        raise Invalid(f"name {exc}", details={"field": "metadata.name"}) from None
    return value


class Client(ListingCalls, ForkCalls, ExportCalls, StatisticsCalls, WebhookCalls):
    """A synchronous client for one nodus API and a default project.

    ``collection`` arguments are the REST plurals (``"agents"``, ``"agentruns"``); every method
    takes ``project=`` to override the client's default for one call.
    """

    def __init__(
        self,
        api_url: str | None = None,
        *,
        project: str | None = None,
        token: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        transport: httpx.BaseTransport | None = None,
        settings: Settings | None = None,
    ) -> None:
        base = settings or load_settings()
        self.settings = Settings(
            api_url=(api_url or base.api_url).rstrip("/"),
            project=project or base.project,
            token=token if token is not None else base.token,
        )
        from . import __version__  # the package is fully imported by the time a Client exists

        headers = {"User-Agent": f"nodus-sdk/{__version__}", "Accept": "application/json"}
        if self.settings.token:
            headers["Authorization"] = f"Bearer {self.settings.token}"
        self._http = httpx.Client(
            base_url=self.settings.api_url,
            headers=headers,
            timeout=_DEFAULT_TIMEOUT if timeout is None else timeout,
            transport=transport,
        )

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return self.settings.api_url

    @property
    def project(self) -> str:
        return self.settings.project

    def close(self) -> None:
        self._http.close()

    def async_http(self) -> httpx.AsyncClient:
        """An asyncio HTTP client to the same API with the same headers (for streams)."""
        return httpx.AsyncClient(
            base_url=self.settings.api_url, headers=self._http.headers, timeout=_DEFAULT_TIMEOUT
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(api_url={_display_url(self.api_url)!r}, project={self.project!r})"

    def _unavailable(self, exc: Exception) -> Unavailable:
        if isinstance(exc, httpx.TimeoutException):
            connecting = isinstance(exc, httpx.ConnectTimeout)
            reason = "the connection timed out" if connecting else "the request timed out"
        else:
            reason = str(exc) or type(exc).__name__
        token = self.settings.token
        if token and token in reason:  # belt and braces: transport errors should never echo headers
            reason = reason.replace(token, "***")
        url = _display_url(self.api_url)
        return Unavailable(
            f"cannot reach the nodus API at {url}: {reason}; is `nodus up` running?",
            details={"url": url},
        )

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        delays: Iterable[float] = _GET_RETRY_DELAYS if method == "GET" else ()
        delays = iter(delays)
        shed_until = time.monotonic() + _SHED_RETRY_BUDGET_SECONDS
        while True:
            try:
                response = self._http.request(method, path, json=json, params=params, headers=headers)
                pause = _retry_after(response)
                if pause is not None and time.monotonic() + pause < shed_until:
                    time.sleep(pause)
                    continue
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                delay = next(delays, None)
                if delay is None:
                    raise self._unavailable(exc) from None
                time.sleep(delay)
            except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
                raise Invalid(
                    f"the API URL {_display_url(self.api_url)!r} is not usable: {exc}",
                    details={"field": "api_url"},
                ) from None
            except httpx.TransportError as exc:
                raise self._unavailable(exc) from None
        if response.is_success:
            return response
        try:
            body = response.json()
        except ValueError:
            body = None
        raise error_from_response(response.status_code, body)

    def _json(self, response: httpx.Response) -> Any:
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise NodusError(
                f"the API at {_display_url(self.api_url)} answered HTTP {response.status_code} "
                "with a body that is not JSON",
                code="BadResponse",
            ) from None

    def _object(self, response: httpx.Response) -> dict[str, Any]:
        """The JSON object an endpoint answers with (its type, for the checker; no check made)."""
        return cast("dict[str, Any]", self._json(response))

    def _object_or_none(self, response: httpx.Response) -> dict[str, Any] | None:
        """The JSON object an endpoint answers with, or None for an empty answer (204)."""
        return cast("dict[str, Any] | None", self._json(response))

    def _path(self, collection: str, project: str | None, name: str | None = None, *sub: str) -> str:
        if collection not in COLLECTIONS:
            raise Invalid(
                f"unknown collection {collection!r}; known: {', '.join(sorted(COLLECTIONS))}",
                details={"field": "collection"},
            )
        path = f"/v1/projects/{_segment(project or self.project, 'project')}/{collection}"
        if name is not None:
            path += f"/{_name(name)}"
        for part in sub:
            path += f"/{part}"
        return path

    @staticmethod
    def _resource_name(resource: Mapping[str, Any]) -> str:
        metadata = resource.get("metadata") if isinstance(resource, Mapping) else None
        name = metadata.get("name") if isinstance(metadata, Mapping) else None
        if not isinstance(name, str):
            raise Invalid("the resource has no metadata.name", details={"field": "metadata.name"})
        return name

    # -- service ----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /healthz``: the ingress answers (the control plane may still be starting)."""
        return self._object(self._request("GET", "/healthz"))

    def ready(self) -> dict[str, Any]:
        """``GET /readyz``: the control plane answers; raises `Unavailable` while it does not."""
        return self._object(self._request("GET", "/readyz"))

    def info(self) -> dict[str, Any]:
        """``GET /v1/info``: server version, storage, model backend and sandbox kind."""
        return self._object(self._request("GET", "/v1/info"))

    def whoami(self) -> dict[str, Any]:
        """``GET /v1/whoami``: the token's ``name``, ``project`` (``*``: every project) and ``role``."""
        return self._object(self._request("GET", "/v1/whoami"))

    # -- tokens -----------------------------------------------------------------------------

    def create_token(
        self, name: str, *, role: str = "read", expires_in: str | None = None, project: str | None = None
    ) -> dict[str, Any]:
        """A new token of the project; ``status.token`` holds its value, shown this once only."""
        spec: dict[str, Any] = {"role": role}
        if expires_in is not None:
            spec["expiresIn"] = expires_in
        return self.create(
            "tokens",
            {"apiVersion": API_VERSION, "kind": "Token", "metadata": {"name": name}, "spec": spec},
            project=project,
        )

    # -- generic resources ------------------------------------------------------------------

    # ``list`` (and its pages): `client_listing.ListingCalls`.

    def get(self, collection: str, name: str, *, project: str | None = None) -> dict[str, Any]:
        return self._object(self._request("GET", self._path(collection, project, name)))

    def create(
        self, collection: str, resource: Mapping[str, Any], *, project: str | None = None
    ) -> dict[str, Any]:
        """POST; raises `Conflict` with code ``AlreadyExists`` when the name is taken."""
        return self._object(self._request("POST", self._path(collection, project), json=dict(resource)))

    def create_result(
        self, collection: str, resource: Mapping[str, Any], *, project: str | None = None
    ) -> Applied:
        """POST, and what the server did (X-Nodus-Result): ``created``, or for a run naming a
        session key, ``delivered`` (sent to the live run holding it, whose resource this is)
        or ``unchanged``."""
        response = self._request("POST", self._path(collection, project), json=dict(resource))
        return Applied(
            self._json(response), response.status_code == 201, response.headers.get("X-Nodus-Result")
        )

    def apply(self, collection: str, resource: Mapping[str, Any], *, project: str | None = None) -> Applied:
        """PUT to ``metadata.name``: create or update; ``created`` tells which (201 or 200)."""
        name = self._resource_name(resource)
        response = self._request("PUT", self._path(collection, project, name), json=dict(resource))
        return Applied(
            self._json(response), response.status_code == 201, response.headers.get("X-Nodus-Result")
        )

    def patch(
        self, collection: str, name: str, patch: Mapping[str, Any], *, project: str | None = None
    ) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386): ``None`` values remove fields."""
        response = self._request(
            "PATCH",
            self._path(collection, project, name),
            json=dict(patch),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        return self._object(response)

    def delete(self, collection: str, name: str, *, project: str | None = None) -> dict[str, Any] | None:
        return self._object_or_none(self._request("DELETE", self._path(collection, project, name)))

    # -- credits ----------------------------------------------------------------------------

    def credits(self, *, project: str | None = None) -> dict[str, Any]:
        """The project's balance, grants, spend and outstanding reservations (USD)."""
        return self._object(self._request("GET", self._path("credits", project)))

    def add_credits(self, amount_usd: str, *, project: str | None = None) -> dict[str, Any]:
        return self._object(
            self._request("POST", self._path("credits", project), json={"amountUSD": amount_usd})
        )

    # -- agent runs -------------------------------------------------------------------------

    def cancel_run(self, name: str, *, project: str | None = None) -> dict[str, Any] | None:
        """Stop the run's command and delete its sandbox; the run ends Cancelled."""
        return self._object_or_none(self._request("POST", self._path("agentruns", project, name, "cancel")))

    def run_steps(self, name: str, *, project: str | None = None) -> builtins.list[dict[str, Any]]:
        """The run's journaled steps, in order."""
        body = self._json(self._request("GET", self._path("agentruns", project, name, "steps")))
        items = body.get("items") if isinstance(body, dict) else None
        return list(items or [])

    def send_message(
        self,
        name: str,
        payload: str,
        *,
        message_key: str | None = None,
        message_name: str = "message",
        project: str | None = None,
    ) -> dict[str, Any]:
        """Send a keep-alive run a message; the same ``message_key`` again is delivered once."""
        body: dict[str, Any] = {"payload": payload, "name": message_name}
        if message_key is not None:
            body["messageKey"] = message_key
        return self._object(
            self._request("POST", self._path("agentruns", project, name, "messages"), json=body)
        )

    def resolve_run(
        self, name: str, resolution: Mapping[str, Any], *, project: str | None = None
    ) -> dict[str, Any]:
        """Decide a run's uncertain step: ``{step, decision, result?, evidence?, revision}``."""
        return self._object(
            self._request("POST", self._path("agentruns", project, name, "resolve"), json=dict(resolution))
        )

    def suspend_run(self, name: str, *, project: str | None = None) -> dict[str, Any]:
        """Park the run with no process (``Waiting``, ``Suspended``) until `resume_run`."""
        return self._object(self._request("POST", self._path("agentruns", project, name, "suspend")))

    def resume_run(self, name: str, *, project: str | None = None) -> dict[str, Any]:
        """Start a suspended run again; it replays its journal."""
        return self._object(self._request("POST", self._path("agentruns", project, name, "resume")))

    def retry_run(self, name: str, *, project: str | None = None) -> dict[str, Any]:
        """Run a Failed run again from its journal (its completed steps are kept)."""
        return self._object(self._request("POST", self._path("agentruns", project, name, "retry")))

    def run_children(self, name: str, *, project: str | None = None) -> builtins.list[dict[str, Any]]:
        """The child runs a Python run spawned (``ctx.spawn``), in creation order."""
        return self.list("agentruns", project=project, params={"parent": name})

    def run_outputs(self, name: str, *, project: str | None = None) -> builtins.list[dict[str, Any]]:
        """``[{"name", "bytes"}]``: the outputs a Python run saved (``ctx.save_output``)."""
        body = self._json(self._request("GET", self._path("agentruns", project, name, "outputs")))
        items = body.get("items") if isinstance(body, dict) else None
        return list(items or [])

    def run_output(self, name: str, output: str, *, project: str | None = None) -> bytes:
        """One output, byte for byte; `NotFound` naming it when the run saved none by that name."""
        path = self._path("agentruns", project, name, "outputs", _segment(output, "output"))
        return self._request("GET", path).content

    def run_logs(self, name: str, *, project: str | None = None) -> str:
        """What a Python run's program printed so far, every attempt in order."""
        return self._request("GET", self._path("agentruns", project, name, "logs")).text

    def upload_source(self, files: Mapping[str, str], *, project: str | None = None) -> dict[str, Any]:
        """Store a Python agent's files; answers ``spec.source`` (``{"digest", "files", "bytes"}``).

        Safe to repeat (the same files are the same digest), so it rides out a replaced replica.
        """
        body = {"files": dict(files)}
        delays = iter(_IDEMPOTENT_WRITE_RETRY_DELAYS)
        while True:
            try:
                return self._object(self._request("POST", self._path("agentsources", project), json=body))
            except NodusError as error:
                delay = next(delays, None)
                if error.status < 500 or delay is None:
                    raise
                time.sleep(delay)

    def run_events(
        self, name: str, *, follow: bool = True, last_event_id: str | None = None, project: str | None = None
    ) -> Iterator[RunEvent]:
        """The run's events (steps, phase, turns, answer) as they happen; with ``follow`` until
        the run ends, else until caught up. Reconnects by itself (``Last-Event-ID``)."""
        path = self._path("agentruns", project, name, "events")
        return follow_events(self._http, path, follow=follow, last_event_id=last_event_id)

    def run_answer(self, name: str, *, project: str | None = None) -> dict[str, Any]:
        """``{name, phase, answer, bytes}``; raises `Conflict` (``AnswerNotReady``) before there is one."""
        return self._object(self._request("GET", self._path("agentruns", project, name, "answer")))

    def create_runs(
        self, runs: Iterable[Mapping[str, Any]], *, idempotency_key: str, project: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        """POST an AgentRunList: every run is created, in list order, or none is (at most 100).

        The same ``idempotency_key`` again returns the first answer and creates nothing, so a
        batch whose answer was lost can be sent again safely; that is also why this one write
        is retried when the answer did not come (no connection, or a server failure such as an
        API replica that died mid-request and is being replaced).
        """
        body = {"apiVersion": API_VERSION, "kind": "AgentRunList", "items": [dict(run) for run in runs]}
        headers = {"Idempotency-Key": idempotency_key}
        delays = iter(_IDEMPOTENT_WRITE_RETRY_DELAYS)
        while True:
            try:
                response = self._request("POST", self._path("agentruns", project), json=body, headers=headers)
                break
            except NodusError as error:
                delay = next(delays, None)
                if error.status < 500 or delay is None:
                    raise
                time.sleep(delay)
        listed = self._json(response)
        items = listed.get("items") if isinstance(listed, dict) else None
        return list(items or [])

    # -- agent groups -----------------------------------------------------------------------

    def cancel_group(self, name: str, *, project: str | None = None) -> dict[str, Any]:
        """Cancel the group's unfinished runs; finished runs keep their answers."""
        return self._object(self._request("POST", self._path("agentgroups", project, name, "cancel")))

    def group_runs(self, name: str, *, project: str | None = None) -> builtins.list[dict[str, Any]]:
        """The group's member runs, in creation order."""
        return self.list("agentruns", project=project, params={"group": name})

    def group_results(self, name: str, *, project: str | None = None) -> dict[str, Any]:
        """An evaluation group's cases (``items``) and its ``evaluation`` status."""
        return self._object(self._request("GET", self._path("agentgroups", project, name, "results")))

    # -- environments -----------------------------------------------------------------------

    def environments(self, *, project: str | None = None) -> builtins.list[dict[str, Any]]:
        """Every Environment the server can evaluate on, at every installed version."""
        return self.list("environments", project=project)
