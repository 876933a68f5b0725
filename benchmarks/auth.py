"""What checking a token costs a request, beside the same app without the check.

The Serve app in this process (no Ray: the control plane is a stub that answers at once, so
only the app's own work is timed), called through httpx's ASGI transport:

- **baseline**: the app with the `Authenticator` middleware removed (for this measurement only);
- **token, cached**: the app as served; the token's principal is in the replica's cache;
- **token, looked up**: the cache is cleared before every request, so each one asks the stub
  control plane (on a real cluster that is one actor call, about 1 ms, once per 5 s per token).

    python benchmarks/auth.py --requests 3000
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import sys
import tempfile
import time
import types
from datetime import date
from pathlib import Path
from typing import Any

import httpx

from nodus.resources import Token
from nodus_ray.control.client import ControlPlaneClient, FailFast
from nodus_ray.control.tokens import TokenStore
from nodus_ray.store.storage import Storage
from nodus_serve.app import create_app
from nodus_serve.auth import Authenticator

_ROUNDS = 6


class _Stub:
    def __init__(self, store: TokenStore) -> None:
        self.store = store

    async def call(self, method: str, *args: Any) -> Any:
        if method == "authenticate":
            principal = self.store.authenticate(args[0])
            return principal.to_dict() if principal else None
        return {"metadata": {"name": args[-1]}, "spec": {}}


class _StubHandle:
    """The stub as the app's client sees a Ray handle: ``handle.<method>.remote(*args)``."""

    def __init__(self, stub: _Stub) -> None:
        self._stub = stub

    def __getattr__(self, method: str) -> Any:
        return types.SimpleNamespace(remote=functools.partial(self._stub.call, method))


def _client(stub: _Stub) -> ControlPlaneClient:
    handle = _StubHandle(stub)
    return ControlPlaneClient(FailFast(), locate=lambda: handle)


async def _time(app: Any, token: str, requests: int, before: Any = None) -> list[float]:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api", headers=headers
    ) as http:
        for _ in range(50):
            (await http.get("/v1/projects/p/agents/a")).raise_for_status()
        times = []
        for _ in range(requests):
            if before is not None:
                before()
            began = time.perf_counter()
            (await http.get("/v1/projects/p/agents/a")).raise_for_status()
            times.append(time.perf_counter() - began)
        return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    store = TokenStore(Storage(str(Path(tempfile.mkdtemp(prefix="nodus-bench-auth-")))))
    token = store.create(
        "p",
        Token.model_validate({"metadata": {"name": "bench"}, "spec": {"role": "read"}}),
        created_by="bench",
    )["status"]["token"]
    served = create_app(_client(_Stub(store)))
    bare = create_app(_client(_Stub(store)))
    bare.user_middleware = [m for m in bare.user_middleware if m.cls is not Authenticator]
    cache = next(m.kwargs["cache"] for m in served.user_middleware if m.cls is Authenticator)
    configurations = (
        ("baseline (no check)", bare, None),
        ("token, cached", served, None),
        ("token, looked up", served, cache.clear),
    )
    measured: dict[str, list[float]] = {label: [] for label, _, _ in configurations}
    for _ in range(_ROUNDS):  # interleaved, so drift (GC, caches, the other core) hits all alike
        for label, app, before in configurations:
            measured[label] += asyncio.run(_time(app, token, args.requests // _ROUNDS, before))
    rows = []
    for label, times in measured.items():
        rows.append((label, statistics.median(times) * 1e6, sorted(times)[int(0.99 * len(times))] * 1e6))
        print(f"{label}: median {rows[-1][1]:.0f} us", file=sys.stderr)
    print("| date | request | median | p99 |\n| --- | --- | --- | --- |")
    for label, median, p99 in rows:
        print(f"| {date.today()} | {label} | {median:.0f} µs | {p99:.0f} µs |")


if __name__ == "__main__":
    main()
