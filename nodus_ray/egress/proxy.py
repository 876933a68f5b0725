"""The egress proxy: a run's commands reach the hosts its Agent allows, and nothing else.

A sandboxed command has a network namespace with only loopback. Inside it,
``egress_forwarder.py`` listens on ``127.0.0.1:3128`` (the proxy variables point there) and
carries every connection over a Unix socket bind-mounted from the host, to :class:`EgressProxy`
on the host. The proxy speaks HTTP/1.1 proxying -- ``CONNECT host:port`` for TLS and anything
else, and absolute-form plain HTTP (``GET http://host/path``) -- and decides with an
:class:`~nodus.egress_policy.EgressPolicy`:

* the host asked for must be in ``network.allowedHosts``, else ``403`` (``HostNotAllowed``);
* it is resolved here, on the host, and every address must be public or in a network the
  operator opened, else ``403`` (``PrivateAddress``): no rebinding or ``localhost`` into the
  host's own ports;
* the proxy connects to an address it checked, never to the name again, so DNS cannot change
  the answer between the check and the connection.

Every connection that asked for something ends in exactly one :class:`EgressRecord` handed to
``on_record``: where it went, how it ended and how many bytes moved, never a path, header or
body (those can hold credentials).

The proxy runs an asyncio loop in its own daemon thread, so the run's own (synchronous) code
only calls :meth:`EgressProxy.start` and :meth:`EgressProxy.close`. Parsing a request's head is
:mod:`nodus_ray.egress.http_head`; what the sandbox side needs (mounts, the forwarder's command
line, proxy variables) is :mod:`nodus_ray.egress.wiring`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from nodus.egress_policy import (
    MAX_ALLOWED_HOSTS,
    PRIVATE_NETWORKS_ENV,
    EgressPolicy,
    IPAddress,
    parse_private_networks,
    validate_allowed_host,
    validate_allowed_hosts,
)
from nodus_ray.egress.http_head import MAX_HEADER_BYTES, _answer, _bad_request, _parse_head, _Refusal
from nodus_ray.egress.resolve import resolve_addresses
from nodus_ray.store.timestamps import utc_now

__all__ = [
    "EgressPolicy",
    "EgressProxy",
    "EgressRecord",
    "MAX_ALLOWED_HOSTS",
    "PRIVATE_NETWORKS_ENV",
    "parse_private_networks",
    "validate_allowed_host",
    "validate_allowed_hosts",
]

logger = logging.getLogger(__name__)

_HEADER_TIMEOUT_SECONDS = 30.0  # a client that sends no complete request head by then is dropped
_RESOLVE_TIMEOUT_SECONDS = 10.0
_CONNECT_TIMEOUT_SECONDS = 10.0
_MAX_CONNECTIONS = 128  # per proxy (one run): bounds the host's descriptors and threads
_CHUNK = 64 << 10
_MAX_HOST_CHARS = 255
_LINGER_SECONDS = 1.0
_LINGER_BYTES = 1 << 20


@dataclass(frozen=True)
class EgressRecord:
    """One connection a command made through the proxy; never a path, header or body.

    ``outcome``: ``allowed`` (connected; bytes may have moved), ``refused`` (the policy or a
    bad request said no) or ``failed`` (allowed, but the name did not resolve or the
    connection could not be made). ``reason`` is None when allowed, else ``HostNotAllowed``,
    ``PrivateAddress``, ``BadRequest``, ``TooManyConnections``, ``ResolveFailed`` or
    ``ConnectFailed``. ``bytes_up``/``bytes_down`` count what was sent to and received from
    the destination (for plain HTTP the request head as rewritten by the proxy is included).
    """

    host: str
    port: int
    outcome: str
    reason: str | None
    bytes_up: int
    bytes_down: int
    duration_seconds: float
    started_at: str  # ISO-8601 UTC
    method: str  # CONNECT, or the method of a plain-HTTP request

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "outcome": self.outcome,
            "reason": self.reason,
            "bytesUp": self.bytes_up,
            "bytesDown": self.bytes_down,
            "durationSeconds": self.duration_seconds,
            "startedAt": self.started_at,
            "method": self.method,
        }


class _Attempt:
    """What one client connection asked for and what happened, filled in as it goes."""

    def __init__(self) -> None:
        self.started_at = utc_now()
        self.started = time.monotonic()
        self.host = ""
        self.port = 0
        self.method = ""
        self.outcome = "refused"
        self.reason: str | None = "BadRequest"
        self.bytes_up = 0
        self.bytes_down = 0

    def record(self) -> EgressRecord:
        return EgressRecord(
            host=self.host,
            port=self.port,
            outcome=self.outcome,
            reason=self.reason,
            bytes_up=self.bytes_up,
            bytes_down=self.bytes_down,
            duration_seconds=round(time.monotonic() - self.started, 3),
            started_at=self.started_at,
            method=self.method,
        )


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After an error answer: end our side, then read (and drop) what the client still sends.

    Closing with unread input (a request body, a TLS hello sent right after CONNECT) makes
    the kernel send a reset, which can destroy the answer before the client reads it.
    Bounded in time and bytes.
    """
    if writer.can_write_eof():
        writer.write_eof()
    budget = _LINGER_BYTES
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_LINGER_SECONDS):
            while budget > 0 and (data := await reader.read(_CHUNK)):
                budget -= len(data)


class EgressProxy:
    """HTTP proxy on a Unix socket that lets one run reach only what its policy allows.

    ``on_record`` is called once per connection when it ends, on the proxy's thread (keep it
    quick: it holds up the proxy meanwhile); an exception from it is logged and ignored.
    ``on_open`` (optional, same rules) is called once a connection is allowed and open, with
    its record so far: what a process killed mid-connection leaves as the only trace of it.
    Connections that close without sending anything are not recorded. ``socket_mode`` is
    0666 by default because commands run as an unprivileged per-run uid; the socket is only
    reachable where it is bind-mounted (or by the host users who can reach its directory).
    """

    def __init__(
        self,
        socket_path: Path,
        policy: EgressPolicy,
        on_record: Callable[[EgressRecord], None],
        *,
        socket_mode: int = 0o666,
        max_connections: int = _MAX_CONNECTIONS,
        on_open: Callable[[EgressRecord], None] | None = None,
    ) -> None:
        self.socket_path = Path(socket_path)
        self.policy = policy
        self.on_record = on_record
        self.on_open = on_open
        self.socket_mode = socket_mode
        self.max_connections = max_connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> EgressProxy:
        """Listen on ``socket_path`` (replacing a stale socket there); returns once listening."""
        if self._thread is not None:
            raise RuntimeError("egress proxy already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="nodus-egress", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._listen(), loop).result(timeout=30)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop listening, end every open connection (each is recorded) and remove the socket.

        Not from ``on_record``: that runs on the proxy's own thread, which close waits for.
        """
        if self._thread is not None and threading.current_thread() is self._thread:
            raise RuntimeError("EgressProxy.close() cannot be called from on_record")
        if self._closed:
            return
        self._closed = True
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=30)
        if loop is not None and not loop.is_running():
            loop.close()
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                self.socket_path.unlink()

    @property
    def open_connections(self) -> int:
        """Connections not yet ended (and so not yet recorded)."""
        return len(self._tasks)

    def __enter__(self) -> EgressProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def _listen(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                self.socket_path.unlink()  # left by a crashed process; anything else is an error
        self._server = await asyncio.start_unix_server(
            self._client, path=str(self.socket_path), limit=MAX_HEADER_BYTES
        )
        os.chmod(self.socket_path, self.socket_mode)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(loop.shutdown_default_executor(), timeout=5)

    # -- one connection ---------------------------------------------------------------------
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        attempt = _Attempt()
        upstream: asyncio.StreamWriter | None = None
        record = True
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _HEADER_TIMEOUT_SECONDS)
            except asyncio.IncompleteReadError as exc:
                record = bool(exc.partial)  # nothing asked, nothing to record
                return
            except asyncio.LimitOverrunError:
                raise _bad_request(f"request head larger than {MAX_HEADER_BYTES} bytes") from None
            except TimeoutError:
                raise _bad_request("no complete request head in time") from None
            request = _parse_head(head)
            attempt.method, attempt.port = request.method, request.port
            attempt.host = request.host[:_MAX_HOST_CHARS]  # a record of junk stays small
            if len(self._tasks) > self.max_connections:
                raise _Refusal(
                    503,
                    "refused",
                    "TooManyConnections",
                    f"nodus egress: more than {self.max_connections} connections open",
                )
            upstream_reader, upstream = await self._open(request.host, request.port)
            attempt.outcome, attempt.reason = "allowed", None
            if self.on_open is not None:
                self._emit(attempt.record(), self.on_open)
            if request.method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                upstream.write(request.head)
                attempt.bytes_up += len(request.head)
                await upstream.drain()
            await self._relay(reader, writer, upstream_reader, upstream, attempt)
        except _Refusal as refusal:
            attempt.outcome, attempt.reason = refusal.outcome, refusal.reason
            with contextlib.suppress(Exception):
                writer.write(_answer(refusal.status, refusal.text))
                await writer.drain()
                await _linger(reader, writer)
        except (ConnectionError, OSError):
            pass  # the client or the destination went away; the record says what moved
        finally:
            for stream in (upstream, writer):
                if stream is not None:
                    stream.close()
            for stream in (upstream, writer):
                if stream is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(stream.wait_closed(), timeout=1)
            self._tasks.discard(task)
            if record:
                self._emit(attempt.record())

    async def _open(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to an address of ``host`` that the policy allows, or a _Refusal."""
        if not self.policy.allows(host, port):
            raise _Refusal(
                403,
                "refused",
                "HostNotAllowed",
                f"nodus egress: {host[:_MAX_HOST_CHARS]}:{port} is not in network.allowedHosts",
            )
        addresses = await self._resolve(host, port)
        private = [a for a in addresses if not self.policy.address_allowed(a)]
        if private:
            raise _Refusal(
                403,
                "refused",
                "PrivateAddress",
                f"nodus egress: {host} resolves to a private address ({private[0]}); only the "
                f"operator can open private networks ({PRIVATE_NETWORKS_ENV})",
            )
        for address in addresses:  # the checked addresses, never the name again
            with contextlib.suppress(OSError, TimeoutError):
                return await asyncio.wait_for(
                    asyncio.open_connection(str(address), port, limit=_CHUNK), _CONNECT_TIMEOUT_SECONDS
                )
        raise _Refusal(502, "failed", "ConnectFailed", f"nodus egress: cannot connect to {host}:{port}")

    async def _resolve(self, host: str, port: int) -> list[IPAddress]:
        """Every address ``host`` has, resolved here; an address literal is itself."""
        addresses = await resolve_addresses(host, port, _RESOLVE_TIMEOUT_SECONDS)
        if not addresses:
            raise _Refusal(502, "failed", "ResolveFailed", f"nodus egress: cannot resolve {host}")
        return addresses

    async def _relay(
        self,
        client_reader: asyncio.StreamReader,
        client: asyncio.StreamWriter,
        upstream_reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
        attempt: _Attempt,
    ) -> None:
        """Copy both ways until both sides have finished sending, or either breaks.

        A clean end of one direction is passed on as a half-close, so a client that shuts
        its sending side after a request still gets the whole answer.
        """

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, up: bool) -> None:
            while data := await source.read(_CHUNK):
                sink.write(data)
                if up:
                    attempt.bytes_up += len(data)
                else:
                    attempt.bytes_down += len(data)
                await sink.drain()
            if sink.can_write_eof():
                sink.write_eof()

        pumps = {
            asyncio.ensure_future(pump(client_reader, upstream, True)),
            asyncio.ensure_future(pump(upstream_reader, client, False)),
        }
        try:
            pending = pumps
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(task.exception() is not None for task in done):
                    break  # one side broke: the other direction has nowhere to go
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    def _emit(self, record: EgressRecord, callback: Callable[[EgressRecord], None] | None = None) -> None:
        try:
            (callback or self.on_record)(record)
        except Exception:
            logger.exception("egress record callback failed for %s:%s", record.host, record.port)
