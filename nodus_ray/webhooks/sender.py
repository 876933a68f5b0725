"""One delivery attempt: a POST to the very address `addresses` checked, no redirect followed.

The request goes to the checked IP address with the URL's host in ``Host`` and as the TLS
server name (httpx's ``sni_hostname``), so the certificate is verified for the name while the
connection cannot be steered elsewhere by a second DNS answer. A 2xx is success; anything else,
a redirect included, a timeout or a refused connection is a failure the caller retries.
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

from nodus_ray.webhooks.addresses import Destination

__all__ = ["AttemptResult", "send"]

_MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class AttemptResult:
    """What one attempt got: the status code (None: no answer), its time, what went wrong."""

    status_code: int | None
    duration_ms: int
    error: str | None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def _pinned_url(url: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    parts = urlsplit(url)
    host = f"[{address}]" if isinstance(address, ipaddress.IPv6Address) else str(address)
    return urlunsplit((parts.scheme, f"{host}:{port}", parts.path or "/", parts.query, ""))


def _host_header(destination: Destination) -> str:
    default = 443 if destination.scheme == "https" else 80
    host = f"[{destination.host}]" if ":" in destination.host else destination.host
    return host if destination.port == default else f"{host}:{destination.port}"


async def send(
    client: httpx.AsyncClient, url: str, destination: Destination, headers: dict[str, str], body: bytes
) -> AttemptResult:
    """POST ``body`` to the first of the destination's addresses that takes a connection."""
    started = time.monotonic()
    error = "no address to connect to"
    for address in destination.addresses:
        request = client.build_request(
            "POST",
            _pinned_url(url, address, destination.port),
            content=body,
            headers={**headers, "host": _host_header(destination), "user-agent": "nodus-webhooks/1"},
            extensions={"sni_hostname": destination.host},
        )
        try:
            response = await client.send(request, follow_redirects=False)
            await response.aclose()
        except httpx.ConnectError as exc:
            error = f"cannot connect to {address}: {exc}"[:_MAX_ERROR_CHARS]
            continue
        except httpx.TimeoutException:
            error = "timed out"
            break
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS]
            break
        elapsed = int((time.monotonic() - started) * 1000)
        failure = None
        if response.is_redirect:
            failure = f"HTTP {response.status_code}: redirects are not followed"
        elif not response.is_success:
            failure = f"HTTP {response.status_code}"
        return AttemptResult(response.status_code, elapsed, failure)
    return AttemptResult(None, int((time.monotonic() - started) * 1000), error)
