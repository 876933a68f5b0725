"""Where a Webhook may send: public addresses only, unless the operator opened private ones.

A Webhook's URL is chosen by anyone who may write the project's Webhooks, and the server sends
from inside the cluster, so without this check a URL could reach the host's Ray, its API, a
cloud metadata service (169.254.169.254) or the internal network (server-side request forgery).
The host is resolved and every address it has must be public (`egress_policy.is_public_address`:
no loopback, private, link-local, multicast, reserved, shared or unspecified address, nor an
IPv6 form that carries one), at apply time and again before each attempt; the attempt then
connects to the very address checked (`sender`), so a name that changes its answer in between
(DNS rebinding) cannot slip through. Redirects are never followed.

The operator opens private addresses with ``NODUS_WEBHOOK_ALLOW_PRIVATE``: ``1`` (any) or
comma-separated CIDRs (``10.0.0.0/8,127.0.0.1/32``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from nodus.egress_policy import (
    IPAddress,
    IPNetwork,
    is_public_address,
    normalize_host,
    parse_private_networks,
)
from nodus_ray.egress.resolve import resolve_addresses

__all__ = [
    "ALLOW_PRIVATE_ENV",
    "PrivateAccess",
    "Destination",
    "UnsafeDestination",
    "resolve_destination",
]

ALLOW_PRIVATE_ENV = "NODUS_WEBHOOK_ALLOW_PRIVATE"
_RESOLVE_TIMEOUT_SECONDS = 5.0
_ALL = frozenset({"1", "true", "yes", "on", "all"})
_NONE = frozenset({"", "0", "false", "no", "off"})


class UnsafeDestination(ValueError):
    """The URL's host cannot be resolved, or resolves to an address the server may not call."""


@dataclass(frozen=True)
class PrivateAccess:
    """The operator's leave to send to private addresses: all of them, or these networks."""

    allow_all: bool = False
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> PrivateAccess:
        """``1`` (any private address), CIDRs, or nothing; ValueError names a bad entry."""
        value = (text or "").strip()
        if value.lower() in _NONE:
            return cls()
        if value.lower() in _ALL:
            return cls(allow_all=True)
        networks = parse_private_networks(
            value,
            variable=ALLOW_PRIVATE_ENV,
            refusal="is neither 1 nor a network (CIDRs such as 10.0.0.0/8, separated by commas)",
        )
        return cls(networks=networks)

    def allows(self, address: IPAddress) -> bool:
        if is_public_address(address) or self.allow_all:
            return True
        inner = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        return any(address in net or (inner is not None and inner in net) for net in self.networks)


@dataclass(frozen=True)
class Destination:
    """A checked URL: its scheme, host (as written, for Host and TLS), port and the addresses
    it resolved to, every one allowed."""

    scheme: str
    host: str
    port: int
    addresses: tuple[IPAddress, ...]


async def _resolve(host: str, port: int) -> list[IPAddress]:
    addresses = await resolve_addresses(host, port, _RESOLVE_TIMEOUT_SECONDS)
    if addresses is None:
        raise UnsafeDestination(f"{host!r} is not a host name or an IP address")
    if not addresses:
        raise UnsafeDestination(f"host {normalize_host(host)!r} does not resolve")
    return addresses


async def resolve_destination(url: str, access: PrivateAccess) -> Destination:
    """Resolve the URL's host and check every address; `UnsafeDestination` says which failed."""
    parts = urlsplit(url)
    scheme = parts.scheme
    host = parts.hostname or ""
    port = parts.port or (443 if scheme == "https" else 80)
    addresses = await _resolve(host, port)
    for address in addresses:
        if not access.allows(address):
            shown = f"{host!r} resolves to {address}" if str(address) != host else f"{address}"
            raise UnsafeDestination(
                f"{shown}, which is not a public address (private, loopback, link-local, "
                f"multicast or reserved); the operator may allow it with {ALLOW_PRIVATE_ENV}"
            )
    return Destination(scheme=scheme, host=host, port=port, addresses=tuple(addresses))
