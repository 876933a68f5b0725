"""Inside a sandbox: carry the command's proxy connections from loopback TCP to the host's proxy.

Usage (run by the sandbox with the system python, so: stdlib only, Python 3.8+, no nodus
imports)::

    python3 egress_forwarder.py --listen 127.0.0.1:3128 --socket /tmp/.nodus/egress.sock -- CMD ARGS...

The sandbox's network namespace has only loopback, and programs expect an HTTP proxy at a
TCP address, not a Unix socket. So this script listens on the TCP address, starts CMD, and
copies each connection to the Unix socket (bind-mounted from the host, where the proxy decides
what is allowed: nothing is decided here). It binds before starting CMD, so CMD never finds
the port closed.

It is invisible to CMD's caller: it prints nothing (except a one-line note on stderr if the
port cannot be bound, in which case CMD runs without network), passes SIGTERM, SIGINT, SIGHUP
and SIGQUIT on to CMD, and exits with CMD's status -- if CMD died from a signal it kills
itself with the same signal, so the status its parent sees is the same as without it.

All connections are relayed by one thread (see ``_Relay``). Annotations use the modern
spelling; ``from __future__ import annotations`` keeps them unevaluated, so 3.8 runs this file.
"""

from __future__ import annotations

import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import NoReturn

_CHUNK = 64 << 10
_MAX_CONNECTIONS = 128
_CONNECT_TIMEOUT_SECONDS = 10.0
_LINGER_SECONDS = 1.0
_FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_USAGE = "usage: egress_forwarder.py --listen HOST:PORT --socket PATH -- CMD [ARGS...]"
_UNREACHABLE_TEXT = b"nodus egress: the egress proxy is not running\n"
_UNREACHABLE = (
    b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
    b"Connection: close\r\n\r\n%s" % (len(_UNREACHABLE_TEXT), _UNREACHABLE_TEXT)
)


def _parse(argv: list[str]) -> tuple[str, int, str, list[str]]:
    """(host, port, socket path, command) from our argv; exit 2 with usage if malformed."""
    if "--" not in argv:
        _usage()
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    values: dict[str, str | None] = {}
    it = iter(options)
    for flag in it:
        if flag not in ("--listen", "--socket"):
            _usage()
        values[flag] = next(it, None)
    listen, path = values.get("--listen"), values.get("--socket")
    if not listen or not path or not command or ":" not in listen:
        _usage()
    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        _usage()
    return host, int(port), path, command


def _usage() -> NoReturn:
    sys.stderr.write(_USAGE + "\n")
    sys.exit(2)


class _Direction:
    """Bytes on their way from ``src`` to ``dst`` (``dst`` None: read and dropped)."""

    def __init__(self, src: socket.socket, dst: socket.socket | None, pending: bytes = b"") -> None:
        self.src = src
        self.dst = dst
        self.buf = bytearray(pending)
        self.src_done = False  # src sent EOF (or, for a canned answer, there is no src)
        self.shut = False  # dst has been told EOF


class _Link:
    """One client connection and its Unix-socket twin, or a canned answer if there is none."""

    def __init__(self, client: socket.socket, upstream: socket.socket | None) -> None:
        self.client = client
        self.upstream = upstream
        self.up = _Direction(client, upstream)
        if upstream is None:
            self.down = _Direction(client, client, _UNREACHABLE)
            self.down.src_done = True
        else:
            self.down = _Direction(upstream, client)
        # A link without a proxy only lingers to read what the client already sent: closing
        # with unread input would send a reset that can destroy the answer.
        self.deadline = time.monotonic() + _LINGER_SECONDS if upstream is None else None

    def sockets(self) -> list[socket.socket]:
        return [self.client] if self.upstream is None else [self.client, self.upstream]

    def finished(self) -> bool:
        return self.up.shut and self.down.shut


class _Relay:
    """Every connection on one thread, with non-blocking sockets and a selector.

    One thread, not one or two per connection: threads count against the sandbox uid's
    process limit (``ulimit -u``), so a command with many connections open would otherwise
    find it cannot fork.
    """

    def __init__(self, listener: socket.socket, path: str) -> None:
        self.listener = listener
        self.path = path
        self.selector = selectors.DefaultSelector()
        self.links: set[_Link] = set()
        self.interest: dict[socket.socket, int] = {}

    def run(self) -> None:
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        while True:
            for key, mask in self.selector.select(timeout=_LINGER_SECONDS / 2):
                if key.data is None:
                    self._accept()
                else:
                    self._event(key.data, key.fileobj, mask)  # type: ignore[arg-type]
            now = time.monotonic()
            for link in [x for x in self.links if x.deadline is not None and x.deadline < now]:
                self._drop(link)

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:  # EAGAIN after a spurious wakeup, or out of descriptors: try later
            return
        if len(self.links) >= _MAX_CONNECTIONS:
            _close(client)
            return
        connecting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream: socket.socket | None = connecting
        try:
            # Blocking, but a Unix connect is immediate unless the proxy's backlog is full.
            connecting.settimeout(_CONNECT_TIMEOUT_SECONDS)
            connecting.connect(self.path)
            connecting.setblocking(False)
        except OSError:
            _close(connecting)
            upstream = None
        client.setblocking(False)
        try:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        link = _Link(client, upstream)
        self.links.add(link)
        self._flush(link, link.down)
        self._update(link)

    def _event(self, link: _Link, sock: socket.socket, mask: int) -> None:
        if link not in self.links:
            return
        if mask & selectors.EVENT_READ:
            direction = link.up if sock is link.client else link.down
            try:
                data = sock.recv(_CHUNK)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                self._drop(link)
                return
            if data == b"":
                direction.src_done = True
            elif data and direction.dst is not None:
                direction.buf += data
            self._flush(link, direction)
        if mask & selectors.EVENT_WRITE and link in self.links:
            self._flush(link, link.down if sock is link.client else link.up)
        if link in self.links:
            self._update(link)

    def _flush(self, link: _Link, direction: _Direction) -> None:
        """Send what is buffered; pass EOF on once the buffer is empty; drop the link on error."""
        dst = direction.dst
        try:
            while direction.buf and dst is not None:
                try:
                    sent = dst.send(direction.buf)
                except (BlockingIOError, InterruptedError):
                    return
                del direction.buf[:sent]
            if direction.src_done and not direction.shut:
                direction.shut = True
                if dst is not None:
                    dst.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(link)

    def _update(self, link: _Link) -> None:
        """Watch each socket for what it can do next; close the link when both ways are done."""
        if link.finished() and link.deadline is None:
            self._drop(link)
            return
        for sock in link.sockets():
            out = link.up if sock is link.client else link.down  # read from sock into out.buf
            into = link.down if sock is link.client else link.up  # write into.buf to sock
            events = 0
            if not out.src_done and len(out.buf) < _CHUNK * 4:
                events |= selectors.EVENT_READ
            if into.buf and into.dst is sock:
                events |= selectors.EVENT_WRITE
            self._watch(sock, events, link)
        if link.upstream is None and link.up.src_done and not link.down.buf:
            self._drop(link)  # the canned answer is out and the client has finished sending

    def _watch(self, sock: socket.socket, events: int, link: _Link) -> None:
        before = self.interest.get(sock, 0)
        if events == before:
            return
        if not events:
            self.selector.unregister(sock)
            del self.interest[sock]
        elif not before:
            self.selector.register(sock, events, link)
            self.interest[sock] = events
        else:
            self.selector.modify(sock, events, link)
            self.interest[sock] = events

    def _drop(self, link: _Link) -> None:
        self.links.discard(link)
        for sock in link.sockets():
            if self.interest.pop(sock, 0):
                self.selector.unregister(sock)
            _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _listen(host: str, port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host.strip("[]"), port))
    listener.listen(128)
    return listener


def _exit_like(returncode: int) -> NoReturn:
    """Exit as the child did: same code, or death by the same signal."""
    if returncode >= 0:
        os._exit(returncode)
    sig = -returncode
    try:
        # The child may have dumped core already; a second core of this script would only
        # litter the workspace.
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        time.sleep(1)  # a signal whose default is not to terminate leaves us here
    except (OSError, ValueError):
        pass
    os._exit(128 + sig)


def main(argv: list[str]) -> NoReturn:
    host, port, path, command = _parse(argv)
    try:
        listener = _listen(host, port)
    except OSError as exc:
        sys.stderr.write(
            f"nodus egress: cannot listen on {host}:{port} ({exc.strerror or exc}); "
            "no network for this command\n"
        )
        sys.stderr.flush()
    else:
        threading.Thread(target=_Relay(listener, path).run, name="relay", daemon=True).start()

    child: list[subprocess.Popen[bytes] | None] = [None]
    pending: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child[0] is None:
            pending.append(signum)
            return
        try:
            child[0].send_signal(signum)
        except OSError:
            pass

    for sig in _FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    try:
        # restore_signals (the default) gives the command SIGPIPE's default back; our own
        # handlers are reset by exec.
        child[0] = subprocess.Popen(command)
    except OSError as exc:
        sys.stderr.write(f"nodus egress: cannot run {command[0]}: {exc.strerror or exc}\n")
        sys.stderr.flush()
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
    for signum in pending:
        forward(signum, None)
    started = child[0]
    assert started is not None  # set above, or the process has exited
    _exit_like(started.wait())


if __name__ == "__main__":
    main(sys.argv[1:])
