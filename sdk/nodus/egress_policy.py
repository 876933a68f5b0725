"""Which destinations a run's commands may reach: an Agent's ``network.allowedHosts``, checked.

Pure and synchronous, so the API schema can validate entries and tests can check every rule
without sockets. The proxy (:mod:`nodus_ray.egress.proxy`) asks two questions, in this order:

1. :meth:`EgressPolicy.allows` -- is the host (and port) the command asked for in the list?
   The match is on the name the command asked for, before any DNS.
2. :meth:`EgressPolicy.address_allowed` -- for every address that name resolved to: is it a
   public address, or inside a network the operator opened? Only the operator can open
   private ranges (``NODUS_EGRESS_PRIVATE_NETWORKS``): an agent author who lists
   ``localhost``, a name they control that resolves to ``127.0.0.1`` (DNS rebinding), or
   ``169.254.169.254`` (cloud metadata) must not reach the host's Ray, API or credentials.

Entry forms: ``example.com`` (exactly that name), ``*.example.com`` (any subdomain, at any
depth, but not ``example.com`` itself), an IPv4 or IPv6 literal, each with an optional
``:port`` (IPv6 with a port in brackets: ``[2001:db8::1]:443``). Names are compared without
case and without a trailing dot.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "EgressPolicy",
    "IPAddress",
    "IPNetwork",
    "MAX_ALLOWED_HOSTS",
    "PRIVATE_NETWORKS_ENV",
    "is_public_address",
    "normalize_host",
    "parse_private_networks",
    "validate_allowed_host",
    "validate_allowed_hosts",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_ALLOWED_HOSTS = 64
PRIVATE_NETWORKS_ENV = "NODUS_EGRESS_PRIVATE_NETWORKS"
_MAX_ENTRY_CHARS = 260  # a 253-character name, a wildcard and a port
# One DNS label: letters, digits, hyphens and (for real-world names such as _dmarc hosts)
# underscores; no hyphen at either end.
_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
# IPv6 embeddings whose inner IPv4 address is where the packets really end up.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


@dataclass(frozen=True)
class _Rule:
    """One parsed entry: ``kind`` is "name" (exact), "suffix" (wildcard) or "ip"."""

    kind: str
    value: str  # the name, the suffix with its leading dot, or the compressed address
    port: int | None


def _parse_port(text: str, entry: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 5 or not 1 <= int(text) <= 65535:
        raise ValueError(f"allowed host {entry!r}: the port must be a number from 1 to 65535")
    return int(text)


def _is_name(name: str) -> bool:
    """Whether ``name`` (lowercase, no trailing dot) is a DNS name that is not a number.

    A last label of digits is refused because resolvers read ``127.1`` or ``2130706433`` as
    IPv4 addresses; such a "name" is an address in disguise.
    """
    if not name or len(name) > 253 or not name.isascii():
        return False
    labels = name.split(".")
    return all(_LABEL.match(label) for label in labels) and not labels[-1].isdigit()


def normalize_host(host: str) -> str | IPAddress | None:
    """A requested host as the policy compares it: an address, a lowercase name, or None.

    None means it is neither a valid name nor an address literal, so nothing can allow it.
    Brackets around an IPv6 literal and one trailing dot on a name are dropped.
    """
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if "%" in text:  # an IPv6 zone ("fe80::1%eth0") names a host interface: never allowed
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if text != host:  # brackets around something that is not an IPv6 address
        return None
    name = text.lower()
    if name.endswith("."):
        name = name[:-1]
    return name if _is_name(name) else None


def _parse_entry(entry: object) -> _Rule:
    """The rule for one ``allowedHosts`` entry, or a ValueError that says what is wrong."""
    if not isinstance(entry, str):
        raise ValueError(f"allowed host must be a string, got {type(entry).__name__}")
    if (
        not entry
        or len(entry) > _MAX_ENTRY_CHARS
        or not entry.isascii()
        or not entry.isprintable()
        or any(c.isspace() for c in entry)
    ):
        raise ValueError(
            f"allowed host {entry!r} must be a host name, *.domain or IP address of at most "
            f"{_MAX_ENTRY_CHARS} ASCII characters without spaces (use the punycode form of an "
            "international name)"
        )
    if "/" in entry or "@" in entry:
        raise ValueError(f"allowed host {entry!r}: write a host name such as example.com, not a URL")
    port: int | None = None
    if entry.startswith("["):
        host, sep, rest = entry[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"allowed host {entry!r}: expected [IPv6] or [IPv6]:port")
        if rest:
            port = _parse_port(rest[1:], entry)
        try:
            address = ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"allowed host {entry!r}: {host!r} is not an IPv6 address") from None
        return _Rule("ip", str(address), port)
    if entry.count(":") > 1:  # a bare IPv6 literal; a port needs brackets
        try:
            return _Rule("ip", str(ipaddress.IPv6Address(entry)), None)
        except ValueError:
            raise ValueError(
                f"allowed host {entry!r} is not an IPv6 address (write an IPv6 address with a "
                "port as [2001:db8::1]:443)"
            ) from None
    host, sep, port_text = entry.partition(":")
    if sep:
        port = _parse_port(port_text, entry)
    try:
        return _Rule("ip", str(ipaddress.IPv4Address(host)), port)
    except ValueError:
        pass
    name = host.lower()
    if name.endswith("."):
        name = name[:-1]
    wildcard = name.startswith("*.")
    if wildcard:
        name = name[2:]
    if not _is_name(name):
        raise ValueError(
            f"allowed host {entry!r}: {host!r} is not a valid host name, *.domain or IP address "
            "(labels of letters, digits and hyphens; the last label not all digits)"
        )
    if wildcard:
        if name.count(".") < 1:
            raise ValueError(
                f"allowed host {entry!r}: a wildcard must cover a domain with at least two labels "
                "(*.example.com, not *.com)"
            )
        return _Rule("suffix", "." + name, port)
    if "*" in entry:
        raise ValueError(f"allowed host {entry!r}: '*' is only allowed as a leading '*.'")
    return _Rule("name", name, port)


def _format_rule(rule: _Rule) -> str:
    host = "*" + rule.value if rule.kind == "suffix" else rule.value
    if rule.port is None:
        return host
    if rule.kind == "ip" and ":" in host:
        host = f"[{host}]"
    return f"{host}:{rule.port}"


def validate_allowed_host(entry: object) -> str:
    """``entry`` in its normal form (lowercase, no trailing dot, compressed IPv6), or ValueError.

    For the API schema: the message names the entry and what is wrong with it.
    """
    return _format_rule(_parse_entry(entry))


def validate_allowed_hosts(entries: object) -> list[str]:
    """A whole ``network.allowedHosts`` list, normalized; ValueError past ``MAX_ALLOWED_HOSTS``."""
    if isinstance(entries, str | bytes) or not isinstance(entries, Sequence):
        raise ValueError("network.allowedHosts must be a list of host names")
    if len(entries) > MAX_ALLOWED_HOSTS:
        raise ValueError(f"network.allowedHosts has {len(entries)} entries; at most {MAX_ALLOWED_HOSTS}")
    return [validate_allowed_host(entry) for entry in entries]


def parse_private_networks(
    text: str,
    *,
    variable: str = PRIVATE_NETWORKS_ENV,
    refusal: str = "is not a network (expected CIDRs such as 10.0.0.0/8, separated by commas)",
) -> tuple[IPNetwork, ...]:
    """The operator's comma-separated CIDRs (``10.0.0.0/8, fd00::/8``); ValueError names a bad one
    as ``{variable}: 'entry' {refusal}`` (each setting that takes networks says what else it takes).

    A bare address means just that address; host bits are ignored (``10.1.2.3/8`` is 10/8).
    """
    networks: list[IPNetwork] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(f"{variable}: {part!r} {refusal}") from None
    return tuple(networks)


def _destinations(address: IPAddress) -> list[IPAddress]:
    """The addresses packets to ``address`` really go to, all of which must pass.

    An IPv4-mapped (``::ffff:127.0.0.1``) or NAT64 (``64:ff9b::7f00:1``) address is its IPv4
    address; a 6to4 address (``2002:7f00:1::1``) is itself and the IPv4 relay it names.
    """
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return [address.ipv4_mapped]
        if address in _NAT64:
            return [ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)]
        if address.sixtofour is not None:
            return [address, address.sixtofour]
    return [address]


def _public(address: IPAddress) -> bool:
    return not (
        address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or (isinstance(address, ipaddress.IPv6Address) and address.is_site_local)
        or not address.is_global  # also shared address space (100.64.0.0/10, carrier NAT)
    )


def is_public_address(address: IPAddress) -> bool:
    """Whether ``address`` is reachable without the operator's leave: globally routable unicast.

    Loopback, private, link-local (cloud metadata at 169.254.169.254), multicast, reserved,
    unspecified and shared addresses are not, nor IPv6 forms that carry one of them
    (``::ffff:127.0.0.1``).
    """
    return all(_public(a) for a in _destinations(address))


@dataclass(frozen=True)
class EgressPolicy:
    """The hosts one run may reach, and the private networks the operator opened to all runs.

    Build it with :meth:`from_settings`; the constructor trusts its arguments to be valid
    entries (it raises ValueError for an invalid one all the same).
    """

    allowed_hosts: tuple[str, ...]
    private_networks: tuple[IPNetwork, ...] = ()
    _rules: tuple[_Rule, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.allowed_hosts) > MAX_ALLOWED_HOSTS:
            raise ValueError(f"at most {MAX_ALLOWED_HOSTS} allowed hosts, got {len(self.allowed_hosts)}")
        object.__setattr__(self, "_rules", tuple(_parse_entry(e) for e in self.allowed_hosts))

    @classmethod
    def from_settings(cls, allowed_hosts: Iterable[str], private_networks: str | None = None) -> EgressPolicy:
        """The policy for an Agent's ``network.allowedHosts`` under the operator's setting.

        ``private_networks`` is the operator's comma-separated CIDR list; None reads
        ``NODUS_EGRESS_PRIVATE_NETWORKS`` (empty when unset: no private address is reachable).
        """
        if private_networks is None:
            private_networks = os.environ.get(PRIVATE_NETWORKS_ENV, "")
        hosts = tuple(validate_allowed_hosts(list(allowed_hosts)))
        return cls(hosts, parse_private_networks(private_networks))

    def allows(self, host: str, port: int) -> bool:
        """Whether an entry covers ``host`` (a name or address literal, as requested) and ``port``."""
        target = normalize_host(host)
        if target is None:
            return False
        for rule in self._rules:
            if rule.port is not None and rule.port != port:
                continue
            if isinstance(target, str):
                if (rule.kind == "name" and target == rule.value) or (
                    rule.kind == "suffix" and target.endswith(rule.value)
                ):
                    return True
            elif rule.kind == "ip" and str(target) == rule.value:
                return True
        return False

    def address_allowed(self, address: IPAddress) -> bool:
        """Whether a resolved ``address`` may be connected to: public, or in an operator network.

        An IPv6 form that carries an IPv4 address (``::ffff:10.0.0.1``) is judged by that
        address, so the operator's IPv4 networks cover it and it cannot dodge them.
        """
        for candidate in _destinations(address):
            if _public(candidate):
                continue
            if not any(
                candidate.version == net.version and candidate in net for net in self.private_networks
            ):
                return False
        return True
