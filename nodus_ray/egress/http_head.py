"""Reading a proxy request's head: where it goes and, for plain HTTP, what to send there.

Pure (no sockets): the request line and headers of ``CONNECT host:port`` or an absolute-form
``GET http://host/path``, checked strictly (a bare CR or LF, userinfo in a URL or a malformed
header is refused, not interpreted), and the HTTP answer that ends a refused request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MAX_HEADER_BYTES", "_Refusal", "_Request", "_bad_request", "_parse_head", "_answer"]

MAX_HEADER_BYTES = 16 << 10
_METHOD = re.compile(r"^[A-Z][A-Z0-9_-]{0,31}$")
# Hop-by-hop headers a proxy must not pass on; Connection is replaced by "close".
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "upgrade",
        "te",
        "trailer",
    }
)


class _Refusal(Exception):
    """Ends a request with an HTTP error answer and a record; the text goes to the client."""

    def __init__(self, status: int, outcome: str, reason: str, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.outcome = outcome
        self.reason = reason
        self.text = text


_STATUS_TEXT = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 503: "Service Unavailable"}


def _bad_request(text: str) -> _Refusal:
    return _Refusal(400, "refused", "BadRequest", text)


@dataclass(frozen=True)
class _Request:
    method: str
    host: str
    port: int
    head: bytes  # for plain HTTP, the head to send to the origin; empty for CONNECT


def _split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """``host`` and port from ``host:port`` or ``[v6]:port``; the host keeps no brackets."""
    if authority.startswith("["):
        host, sep, rest = authority[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise _bad_request(f"bad host {authority!r}")
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = authority.partition(":")
    if not port_text:
        if default_port is None:
            raise _bad_request(f"CONNECT needs host:port, got {authority!r}")
        return host, default_port
    if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise _bad_request(f"bad port in {authority!r}")
    return host, int(port_text)


def _parse_head(head: bytes) -> _Request:
    """The destination and, for plain HTTP, the origin-form head to send there.

    Userinfo in a URL (``http://a@b/``) is refused rather than interpreted: which of the two
    names is the host is exactly the kind of ambiguity a policy check must not depend on.
    """
    text = head.decode("latin-1")
    if "\r" in text.replace("\r\n", "") or "\n" in text.replace("\r\n", "") or "\0" in text:
        # A bare CR or LF would end a line for some origins and not for us: header smuggling.
        raise _bad_request("bare CR, LF or NUL in the request head")
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _bad_request("expected an HTTP/1.x request line")
    method, target, version = parts
    if not _METHOD.match(method):
        raise _bad_request("bad method")
    if method == "CONNECT":
        host, port = _split_authority(target, None)
        return _Request(method, host, port, b"")
    if not target[:7].lower() == "http://":
        if target[:8].lower() == "https://":
            raise _bad_request("https:// URLs must be tunnelled with CONNECT")
        raise _bad_request("expected an absolute http:// URL (this is a proxy)")
    rest = target[7:]
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:].split("#", 1)[0]
    if not authority or "@" in authority:
        raise _bad_request("the URL needs a host and no user name")
    host, port = _split_authority(authority, 80)
    if not path.startswith("/"):
        path = "/" + path
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or line[0] in " \t":
            raise _bad_request("malformed header line")
        headers.append((name, value.strip()))
    named_hop = {
        token.strip().lower()
        for name, value in headers
        if name.lower() in ("connection", "proxy-connection")
        for token in value.split(",")
    }
    out = [f"{method} {path} {version}", f"Host: {authority}"]
    for name, value in headers:
        lowered = name.lower()
        if lowered in _HOP_BY_HOP or lowered in named_hop or lowered == "host":
            continue
        out.append(f"{name}: {value}")
    out.append("Connection: close")
    return _Request(method, host, port, ("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))


def _answer(status: int, text: str) -> bytes:
    body = (text + "\n").encode("utf-8", "replace")
    return (
        f"HTTP/1.1 {status} {_STATUS_TEXT.get(status, 'Error')}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("latin-1") + body
