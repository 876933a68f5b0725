"""Resolving a host the way a guard against private addresses must: once, to every address.

The egress proxy and webhook delivery both check each address a name resolves to and then
connect to an address they checked, never to the name again (a second lookup could answer
otherwise). This is the one lookup they share.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

from nodus.egress_policy import IPAddress, normalize_host

__all__ = ["resolve_addresses"]


async def resolve_addresses(host: str, port: int, timeout_seconds: float) -> list[IPAddress] | None:
    """Every IPv4/IPv6 address of ``host`` (an address literal is itself), in the resolver's
    order without repeats; ``[]`` when it does not resolve in time, None when ``host`` is not a
    host name or an address at all.

    The name resolved is the normalized one (lowercase, no trailing dot): ``/etc/hosts``
    lookups do not match an absolute ``name.``.
    """
    target = normalize_host(host)
    if target is None:
        return None
    if not isinstance(target, str):
        return [target]
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(target, port, type=socket.SOCK_STREAM), timeout_seconds
        )
    except (OSError, TimeoutError, UnicodeError):
        infos = []
    addresses: list[IPAddress] = []
    for family, _type, _proto, _name, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    return addresses
