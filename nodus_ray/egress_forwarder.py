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
Annotations use the modern spelling; ``from __future__ import annotations`` keeps them
unevaluated, so 3.8 runs this file.
"""

from __future__ import annotations

import os
import resource
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
    options, command = argv[:split], argv[split + 1:]
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


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _pump(source: socket.socket, sink: socket.socket, both: tuple[socket.socket, ...]) -> None:
    """Copy until ``source`` ends, then half-close ``sink``; on an error, break both sockets."""
    try:
        while True:
            data = source.recv(_CHUNK)
            if not data:
                break
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        for sock in both:  # unblocks the other direction's recv
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _refuse(client: socket.socket) -> None:
    """Answer 502, then read what the client already sent before closing.

    Closing a socket with unread input sends a reset, which can destroy the answer before
    the client reads it.
    """
    try:
        client.sendall(_UNREACHABLE)
        client.shutdown(socket.SHUT_WR)
        client.settimeout(_LINGER_SECONDS)
        while client.recv(_CHUNK):
            pass
    except OSError:
        pass


def _carry(client: socket.socket, path: str, slots: threading.BoundedSemaphore) -> None:
    """One connection: connect to the proxy socket and copy both ways, a thread per direction."""
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            upstream.settimeout(_CONNECT_TIMEOUT_SECONDS)
            upstream.connect(path)
            upstream.settimeout(None)
        except OSError:
            _refuse(client)
            return
        pair = (client, upstream)
        back = threading.Thread(target=_pump, args=(upstream, client, pair), daemon=True)
        back.start()
        _pump(client, upstream, pair)
        back.join()
    finally:
        _close(upstream)
        _close(client)
        slots.release()


def _serve(listener: socket.socket, path: str) -> None:
    """Accept forever; the process exits with the command, which ends this thread."""
    slots = threading.BoundedSemaphore(_MAX_CONNECTIONS)
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            time.sleep(0.05)  # out of descriptors, say: try again rather than give up
            continue
        if not slots.acquire(blocking=False):
            _close(client)
            continue
        try:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_carry, args=(client, path, slots), daemon=True).start()
        except (OSError, RuntimeError):
            _close(client)
            slots.release()


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
        sys.stderr.write(f"nodus egress: cannot listen on {host}:{port} ({exc.strerror or exc}); "
                         "no network for this command\n")
        sys.stderr.flush()
    else:
        threading.Thread(target=_serve, args=(listener, path), daemon=True).start()

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
    _exit_like(child[0].wait())


if __name__ == "__main__":
    main(sys.argv[1:])
