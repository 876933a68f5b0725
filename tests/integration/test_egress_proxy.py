"""The egress proxy against local servers, and the forwarder inside a real bubblewrap sandbox.

No Ray and no `server` fixture: each test starts its own proxy on a Unix socket in a temp
directory and talks to it with raw sockets, so what the proxy sends and records can be
checked byte for byte. Only loopback is reachable here, so destinations are local servers and
the operator's private networks open loopback for the "allowed" cases.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nodus_ray.egress.proxy import EgressPolicy, EgressProxy, EgressRecord
from nodus_ray.egress.wiring import FORWARDER_PATH, SANDBOX_FORWARDER, bwrap_args, proxy_env, wrap_argv

from .conftest import wait_for

LOOPBACK = (ipaddress.ip_network("127.0.0.1/32"),)
_RESPONSE_BODY = b"hello from origin\n"


# -- local destinations -------------------------------------------------------------------------


class _TcpServer:
    """A threaded TCP server on ``host``; ``handle`` serves one accepted connection."""

    def __init__(self, host: str, handle: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_server((host, 0))
        self.host = host
        self.port: int = self.sock.getsockname()[1]
        self.handle = handle
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            self.handle(conn)

    def close(self) -> None:
        self.sock.close()


def _echo(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)


@dataclass
class _Origin:
    """A tiny HTTP/1.x origin that keeps the raw requests it got and answers each the same way."""

    requests: list[bytes] = field(default_factory=list)

    def handle(self, conn: socket.socket) -> None:
        raw = b""
        while b"\r\n\r\n" not in raw:
            chunk = conn.recv(65536)
            if not chunk:
                return
            raw += chunk
        head = raw.split(b"\r\n\r\n", 1)[0]
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(raw) < len(head) + 4 + length:
            raw += conn.recv(65536)
        self.requests.append(raw)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (len(_RESPONSE_BODY), _RESPONSE_BODY)
        )


@pytest.fixture
def echo() -> Iterator[_TcpServer]:
    server = _TcpServer("127.0.0.1", _echo)
    yield server
    server.close()


@pytest.fixture
def origin() -> Iterator[tuple[_TcpServer, _Origin]]:
    state = _Origin()
    server = _TcpServer("127.0.0.1", state.handle)
    yield server, state
    server.close()


# -- the proxy ----------------------------------------------------------------------------------


class _Records:
    """Collects records from the proxy's thread; ``wait`` blocks until ``n`` have arrived."""

    def __init__(self) -> None:
        self.items: list[EgressRecord] = []
        self._cond = threading.Condition()

    def __call__(self, record: EgressRecord) -> None:
        with self._cond:
            self.items.append(record)
            self._cond.notify_all()

    def wait(self, n: int = 1, timeout: float = 10.0) -> list[EgressRecord]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.items) >= n, timeout), self.items
            return list(self.items)


@pytest.fixture
def socket_dir() -> Path:
    # A short path: Unix socket paths are limited to 107 bytes and pytest's tmp_path can be longer.
    return Path(tempfile.mkdtemp(prefix="nodus-egress-"))


@pytest.fixture
def make_proxy(socket_dir: Path) -> Iterator[Callable[..., tuple[EgressProxy, _Records]]]:
    started: list[EgressProxy] = []

    def make(
        allowed: tuple[str, ...],
        private: tuple = LOOPBACK,
        on_record: Callable[[EgressRecord], None] | None = None,
        **kwargs: int,
    ) -> tuple[EgressProxy, _Records]:
        records = _Records()
        callback = records if on_record is None else on_record
        proxy = EgressProxy(
            socket_dir / f"p{len(started)}.sock", EgressPolicy(allowed, private), callback, **kwargs
        ).start()
        started.append(proxy)
        return proxy, records

    yield make
    for proxy in started:
        proxy.close()
    shutil.rmtree(socket_dir, ignore_errors=True)


def _connect(proxy: EgressProxy) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(10)
    client.connect(str(proxy.socket_path))
    return client


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while data := sock.recv(65536):
        out += data
    return out


def _read_head(sock: socket.socket) -> bytes:
    out = b""
    while b"\r\n\r\n" not in out:
        data = sock.recv(1)
        if not data:
            break
        out += data
    return out


def _tunnel(proxy: EgressProxy, target: str, payload: bytes) -> bytes:
    """CONNECT, send ``payload`` (the first bytes in the same write as the request), half-close."""
    with _connect(proxy) as client:
        client.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode() + payload[:100])
        head = _read_head(client)
        assert head == b"HTTP/1.1 200 Connection established\r\n\r\n", head
        client.sendall(payload[100:])
        client.shutdown(socket.SHUT_WR)
        return _read_all(client)


def _ask(proxy: EgressProxy, request: bytes) -> bytes:
    with _connect(proxy) as client:
        client.sendall(request)
        return _read_all(client)


# -- allowed ------------------------------------------------------------------------------------


def test_connect_to_an_allowed_host_relays_both_ways_and_counts_bytes(make_proxy, echo) -> None:
    proxy, records = make_proxy(("127.0.0.1",))
    payload = os.urandom(300_000)
    assert _tunnel(proxy, f"127.0.0.1:{echo.port}", payload) == payload
    [record] = records.wait(1)
    assert (record.host, record.port, record.method) == ("127.0.0.1", echo.port, "CONNECT")
    assert (record.outcome, record.reason) == ("allowed", None)
    assert record.bytes_up == record.bytes_down == len(payload)
    assert record.duration_seconds >= 0 and record.started_at.endswith("Z")


def test_plain_http_is_rewritten_to_origin_form_with_connection_close(make_proxy, origin) -> None:
    server, state = origin
    proxy, records = make_proxy(("127.0.0.1",))
    body = b'{"q": 1}'
    request = (
        f"POST http://127.0.0.1:{server.port}/api/x?token=secret HTTP/1.1\r\n"
        f"Host: wrong.example\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\n"
        f"Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nContent-Length: {len(body)}\r\n"
        "Authorization: Bearer kept-for-the-origin\r\n\r\n"
    ).encode() + body
    response = _ask(proxy, request)
    assert response.startswith(b"HTTP/1.1 200 OK") and response.endswith(_RESPONSE_BODY)
    [sent] = state.requests
    head, _, got_body = sent.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /api/x?token=secret HTTP/1.1"
    assert f"Host: 127.0.0.1:{server.port}" in lines and "Connection: close" in lines
    assert "Authorization: Bearer kept-for-the-origin" in lines
    assert not any(line.lower().startswith(("proxy-", "x-hop", "connection: keep")) for line in lines)
    assert got_body == body
    [record] = records.wait(1)
    assert (record.outcome, record.method, record.port) == ("allowed", "POST", server.port)
    assert record.bytes_up == len(sent) and record.bytes_down == len(response)
    assert "token" not in str(record.to_dict()) and "Bearer" not in str(record.to_dict())


def test_a_host_name_is_resolved_on_the_host(make_proxy, origin) -> None:
    server, _ = origin
    proxy, records = make_proxy(("localhost",), (*LOOPBACK, ipaddress.ip_network("::1/128")))
    response = _ask(proxy, f"GET http://LocalHost.:{server.port}/ HTTP/1.1\r\n\r\n".encode())
    assert response.startswith(b"HTTP/1.1 200 OK")
    assert records.wait(1)[0].outcome == "allowed"


# -- refused ------------------------------------------------------------------------------------


def test_a_host_not_in_the_list_is_refused_and_recorded(make_proxy, echo) -> None:
    proxy, records = make_proxy(("127.0.0.1:1",))  # the right address, another port
    answer = _ask(proxy, b"CONNECT example.org:443 HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert answer.endswith(b"nodus egress: example.org:443 is not in network.allowedHosts\n")
    answer = _ask(proxy, f"GET http://127.0.0.1:{echo.port}/ HTTP/1.1\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 403 ")
    first, second = records.wait(2)
    assert (first.host, first.port, first.outcome, first.reason) == (
        "example.org",
        443,
        "refused",
        "HostNotAllowed",
    )
    assert (second.method, second.reason, second.bytes_up, second.bytes_down) == (
        "GET",
        "HostNotAllowed",
        0,
        0,
    )
    assert echo.accepted == 0


def test_a_name_that_resolves_to_loopback_is_refused_without_the_operators_leave(make_proxy, echo) -> None:
    proxy, records = make_proxy(("localhost", "127.0.0.1"), private=())
    for target in (f"localhost:{echo.port}", f"127.0.0.1:{echo.port}"):
        answer = _ask(proxy, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 403 ") and b"private address" in answer
    assert [(r.outcome, r.reason) for r in records.wait(2)] == [("refused", "PrivateAddress")] * 2
    assert echo.accepted == 0


def test_cloud_metadata_is_refused_even_when_listed(make_proxy) -> None:
    proxy, records = make_proxy(("169.254.169.254",))
    proxy_unlisted, records_unlisted = make_proxy(("127.0.0.1",))
    request = b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n"
    assert _ask(proxy, request).startswith(b"HTTP/1.1 403 ")
    assert _ask(proxy_unlisted, request).startswith(b"HTTP/1.1 403 ")
    assert records.wait(1)[0].reason == "PrivateAddress"
    assert records_unlisted.wait(1)[0].reason == "HostNotAllowed"


def test_resolve_and_connect_failures_are_failed_not_allowed(make_proxy) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    proxy, records = make_proxy(("no-such-host.invalid", "127.0.0.1"))
    assert _ask(proxy, b"CONNECT no-such-host.invalid:443 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 502 ")
    assert _ask(proxy, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode()).startswith(b"HTTP/1.1 502 ")
    assert [(r.outcome, r.reason) for r in records.wait(2)] == [
        ("failed", "ResolveFailed"),
        ("failed", "ConnectFailed"),
    ]


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"hello\r\n\r\n",
        b"GET /relative HTTP/1.1\r\n\r\n",
        b"GET https://127.0.0.1/ HTTP/1.1\r\n\r\n",
        b"GET http://user@127.0.0.1/ HTTP/1.1\r\n\r\n",
        b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n",
        b"CONNECT 127.0.0.1:99999 HTTP/1.1\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/1.1\r\nX-Big: " + b"a" * (20 << 10) + b"\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/1.1\r\nX-A: 1\nX-Smuggled: 1\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/1.1\r\n folded: 1\r\n\r\n",
    ],
)
def test_bad_requests_get_400(make_proxy, request_bytes: bytes) -> None:
    proxy, records = make_proxy(("127.0.0.1",))
    assert _ask(proxy, request_bytes).startswith(b"HTTP/1.1 400 ")
    [record] = records.wait(1)
    assert (record.outcome, record.reason) == ("refused", "BadRequest")


def test_a_connection_that_asks_nothing_is_not_recorded(make_proxy, echo) -> None:
    proxy, records = make_proxy(("127.0.0.1",))
    _connect(proxy).close()
    _tunnel(proxy, f"127.0.0.1:{echo.port}", b"x")
    assert [r.method for r in records.wait(1)] == ["CONNECT"]
    # The silent connection was accepted first, so its handler has started; once every handler
    # has ended, what it recorded would be there.
    wait_for(lambda: proxy.open_connections == 0, timeout=10, message="the proxy's connections to end")
    assert len(records.items) == 1


# -- robustness ---------------------------------------------------------------------------------


def test_concurrent_connections(make_proxy, echo, origin) -> None:
    server, _ = origin
    proxy, records = make_proxy(("127.0.0.1",))

    def one(i: int) -> bool:
        if i % 2:
            payload = os.urandom(50_000 + i)
            return _tunnel(proxy, f"127.0.0.1:{echo.port}", payload) == payload
        return _ask(proxy, f"GET http://127.0.0.1:{server.port}/{i} HTTP/1.1\r\n\r\n".encode()).endswith(
            _RESPONSE_BODY
        )

    with ThreadPoolExecutor(max_workers=24) as pool:
        assert all(pool.map(one, range(48)))
    assert {r.outcome for r in records.wait(48)} == {"allowed"}


def test_a_failing_callback_does_not_break_the_proxy(make_proxy, echo) -> None:
    seen: list[EgressRecord] = []

    def explode(record: EgressRecord) -> None:
        seen.append(record)
        raise RuntimeError("storage is down")

    proxy, _ = make_proxy(("127.0.0.1",), on_record=explode)
    for _ in range(3):
        assert _tunnel(proxy, f"127.0.0.1:{echo.port}", b"ping") == b"ping"
    assert _ask(proxy, b"CONNECT example.org:443 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 403 ")
    wait_for(lambda: len(seen) >= 4, timeout=10, message="the four records")
    assert len(seen) == 4


def test_too_many_connections_are_refused_with_503(make_proxy, echo) -> None:
    proxy, records = make_proxy(("127.0.0.1",), max_connections=2)
    open_tunnels = []
    for _ in range(2):
        client = _connect(proxy)
        client.sendall(f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\n\r\n".encode())
        assert _read_head(client).startswith(b"HTTP/1.1 200 ")
        open_tunnels.append(client)
    assert _ask(proxy, f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\n\r\n".encode()).startswith(
        b"HTTP/1.1 503 "
    )
    assert records.wait(1)[0].reason == "TooManyConnections"
    for client in open_tunnels:
        client.close()


def test_close_ends_open_tunnels_and_records_them(make_proxy, echo) -> None:
    proxy, records = make_proxy(("127.0.0.1",))
    client = _connect(proxy)
    client.sendall(f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\n\r\n".encode())
    assert _read_head(client).startswith(b"HTTP/1.1 200 ")
    client.sendall(b"abc")
    assert client.recv(3) == b"abc"
    path = proxy.socket_path
    assert path.stat().st_mode & 0o777 == 0o666
    proxy.close()
    assert _read_all(client) == b""
    [record] = records.wait(1)
    assert (record.outcome, record.bytes_up, record.bytes_down) == ("allowed", 3, 3)
    assert not path.exists()
    client.close()


# -- the forwarder in a real sandbox ------------------------------------------------------------

_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
_DROP_UID = 200_777


def _bwrap_works() -> bool:
    bwrap = shutil.which("bwrap")
    if bwrap is None or not os.path.exists("/usr/bin/python3"):
        return False
    probe = subprocess.run(
        [bwrap, *_namespaces(), "--ro-bind", "/", "/", "--", "/bin/true"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


def _namespaces() -> list[str]:
    extra = [] if os.geteuid() == 0 else ["--unshare-user"]
    return ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent", *extra]


needs_bwrap = pytest.mark.skipif(not _bwrap_works(), reason="bubblewrap cannot run here")


def _sandboxed(
    command: str, socket_path: Path, *, wrap: bool = True, drop: bool = False
) -> subprocess.CompletedProcess[str]:
    """``bash -c command`` in a sandbox with only loopback, wired the way sandbox.py will be."""
    env: list[str] = []
    for name, value in proxy_env().items():
        env += ["--setenv", name, value]
    setpriv = shutil.which("setpriv")
    uid_drop: list[str] = []
    if drop and os.geteuid() == 0 and setpriv:
        uid_drop = [
            setpriv,
            f"--reuid={_DROP_UID}",
            f"--regid={_DROP_UID}",
            "--clear-groups",
            "--no-new-privs",
            "--",
        ]
    argv = ["/bin/bash", "-c", command]
    return subprocess.run(
        [
            "bwrap",
            *_namespaces(),
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
            *bwrap_args(socket_path),
            "--clearenv",
            "--setenv",
            "PATH",
            _SANDBOX_PATH,
            *env,
            "--",
            *uid_drop,
            *(wrap_argv(argv) if wrap else argv),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def sandbox_origin() -> Iterator[tuple[_TcpServer, _Origin]]:
    # 127.0.0.2: the proxy variables' NO_PROXY covers 127.0.0.1 (the sandbox's own loopback),
    # so the "remote" server needs another address that is reachable only from the host.
    state = _Origin()
    server = _TcpServer("127.0.0.2", state.handle)
    yield server, state
    server.close()


def _fetch(url: str, *, proxy: bool = True, tunnel: bool = False) -> str:
    """A shell command that prints the HTTP status of ``url`` (or fails like curl does)."""
    if shutil.which("curl"):
        flags = ("" if proxy else "--noproxy '*' ") + ("-p " if tunnel else "")
        return f"curl -sS --max-time 20 -o /dev/null -w '%{{http_code}}' {flags}{url}"
    opener = (
        "urllib.request.build_opener()"
        if proxy
        else "urllib.request.build_opener(urllib.request.ProxyHandler({}))"
    )
    return (
        'python3 -c "import sys, urllib.request, urllib.error\n'
        f"try:\n  r = {opener}.open('{url}', timeout=20); print(r.status, end='')\n"
        "except urllib.error.HTTPError as e:\n  print(e.code, end='')\n"
        'except OSError as e:\n  print(e, file=sys.stderr); sys.exit(7)"'
    )


@needs_bwrap
@pytest.mark.parametrize("drop", [False, True], ids=["root", "dropped-uid"])
def test_forwarder_in_bwrap_reaches_only_allowed_hosts(make_proxy, sandbox_origin, drop: bool) -> None:
    server, state = sandbox_origin
    proxy, records = make_proxy(("127.0.0.2",), private=(ipaddress.ip_network("127.0.0.2/32"),))
    url = f"http://127.0.0.2:{server.port}/hello"

    through = _sandboxed(_fetch(url), proxy.socket_path, drop=drop)
    assert (through.returncode, through.stdout) == (0, "200"), through.stderr
    assert state.requests and state.requests[0].startswith(b"GET /hello HTTP/1.1")
    if shutil.which("curl"):
        tunnelled = _sandboxed(_fetch(url, tunnel=True), proxy.socket_path, drop=drop)
        assert (tunnelled.returncode, tunnelled.stdout) == (0, "200"), tunnelled.stderr

    direct = _sandboxed(_fetch(url, proxy=False), proxy.socket_path, drop=drop)
    assert direct.returncode != 0 and direct.stdout in ("", "000")

    refused = _sandboxed(_fetch(f"http://127.0.0.3:{server.port}/"), proxy.socket_path, drop=drop)
    assert refused.stdout == "403", refused.stderr
    allowed = 2 if shutil.which("curl") else 1
    # A record is made when the proxy has closed its side, which can be after the client is done.
    outcomes = sorted((r.host, r.outcome, r.reason or "") for r in records.wait(allowed + 1))
    assert outcomes == [("127.0.0.2", "allowed", "")] * allowed + [("127.0.0.3", "refused", "HostNotAllowed")]
    assert server.accepted == allowed


@needs_bwrap
@pytest.mark.parametrize(
    "command",
    [
        "exit 0",
        "exit 7",
        "kill -XCPU $$",
        "kill -TERM $$",
        "kill -KILL $$",
        "bash -c 'kill -XCPU $$'",
        "echo out; echo err >&2; exit 3",
    ],
)
def test_forwarder_passes_the_exit_status_and_output_through(make_proxy, command: str) -> None:
    proxy, _ = make_proxy(("127.0.0.1",))
    wrapped = _sandboxed(command, proxy.socket_path)
    bare = _sandboxed(command, proxy.socket_path, wrap=False)
    assert (wrapped.returncode, wrapped.stdout, wrapped.stderr) == (bare.returncode, bare.stdout, bare.stderr)
    assert wrapped.returncode == {"exit 7": 7, "kill -XCPU $$": 152, "bash -c 'kill -XCPU $$'": 152}.get(
        command, wrapped.returncode
    )


@needs_bwrap
def test_forwarder_is_mounted_read_only_where_the_wiring_says(make_proxy) -> None:
    proxy, _ = make_proxy(("127.0.0.1",))
    result = _sandboxed(
        f"test -r {SANDBOX_FORWARDER} && ! echo x >> {SANDBOX_FORWARDER} 2>/dev/null && "
        "stat -c %a /tmp/.nodus",
        proxy.socket_path,
        drop=True,
    )
    assert (result.returncode, result.stdout.strip()) == (0, "755"), result.stderr


# -- the forwarder on its own -------------------------------------------------------------------


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def test_forwarder_passes_sigterm_to_the_command_and_exits_with_its_status(socket_dir: Path) -> None:
    forwarder = subprocess.Popen(
        [
            "/usr/bin/python3",
            str(FORWARDER_PATH),
            "--listen",
            f"127.0.0.1:{_free_port()}",
            "--socket",
            str(socket_dir / "none.sock"),
            "--",
            "/bin/bash",
            "-c",
            "trap 'exit 42' TERM; echo ready; sleep 30 & wait",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert forwarder.stdout is not None
    assert forwarder.stdout.readline() == "ready\n"
    forwarder.send_signal(signal.SIGTERM)
    assert forwarder.wait(timeout=10) == 42


def test_forwarder_answers_502_when_the_proxy_is_gone(socket_dir: Path) -> None:
    port = _free_port()
    result = subprocess.run(
        [
            "/usr/bin/python3",
            str(FORWARDER_PATH),
            "--listen",
            f"127.0.0.1:{port}",
            "--socket",
            str(socket_dir / "none.sock"),
            "--",
            "/usr/bin/python3",
            "-c",
            f"import socket; s = socket.create_connection(('127.0.0.1', {port})); "
            "s.sendall(b'CONNECT example.org:443 HTTP/1.1\\r\\n\\r\\n'); "
            "print(b''.join(iter(lambda: s.recv(200), b'')).decode())",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("HTTP/1.1 502 ") and "egress proxy is not running" in result.stdout


_MANY_TUNNELS = r"""
import os, socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
socks = []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(("CONNECT 127.0.0.2:%d HTTP/1.1\r\n\r\n" % port).encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    socks.append(s)
for pid in os.listdir("/proc"):
    try:
        argv = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
        if argv[0].endswith(b"python3") and any(a.endswith(b"/egress_forwarder.py") for a in argv):
            threads = [l for l in open("/proc/%s/status" % pid) if l.startswith("Threads:")]
            print(threads[0].split()[1])
    except (OSError, ValueError):
        pass
for i, s in enumerate(socks):
    payload = os.urandom(100000 + i)
    s.sendall(payload)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        data = s.recv(65536)
        if not data:
            break
        got += data
    assert got == payload, (i, len(got))
print("ok")
"""


@needs_bwrap
def test_forwarder_relays_many_connections_on_one_thread(make_proxy) -> None:
    echo_server = _TcpServer("127.0.0.2", _echo)
    try:
        proxy, records = make_proxy(("127.0.0.2",), private=(ipaddress.ip_network("127.0.0.2/32"),))
        n = 40
        script = _MANY_TUNNELS.replace("'", "'\"'\"'")
        result = _sandboxed(f"python3 -c '{script}' {echo_server.port} {n}", proxy.socket_path, drop=True)
        assert result.returncode == 0, result.stderr
        threads, ok = result.stdout.split()
        # The main thread and the relay: open connections cost the command no processes.
        assert (int(threads), ok) == (2, "ok")
        assert sorted(r.bytes_up for r in records.wait(n)) == [100000 + i for i in range(n)]
    finally:
        echo_server.close()
