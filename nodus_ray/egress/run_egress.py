"""One run's way out: its egress proxy, started with its sandbox, and the connections it saw.

A run whose Agent lists ``spec.network.allowedHosts`` gets its own `egress.EgressProxy` on a
Unix socket that only its sandbox has bound in. Each connection is recorded when it ends; the
records are handed to the command that made them and journaled with its result, so they are
as durable as the command itself, and the events stream shows each one (`egress` events).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from nodus.egress_policy import EgressPolicy
from nodus_ray.egress.proxy import EgressProxy, EgressRecord

__all__ = ["RunEgress"]

_SETTLE_SECONDS = 2.0  # after a command, how long its closing connections get to be recorded


class RunEgress:
    def __init__(self, allowed_hosts: list[str], private_networks: str) -> None:
        self._policy = EgressPolicy.from_settings(allowed_hosts, private_networks)
        self._records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._proxy: EgressProxy | None = None
        self._directory: Path | None = None

    def start(self) -> Path:
        """Listen, and return the host path of the socket to bind into the sandbox."""
        if self._proxy is None:
            # A short path: a Unix socket's path is limited to 107 bytes. 0711: the sandbox's
            # uid reaches the socket inside it through bubblewrap's bind, never by listing.
            self._directory = Path(tempfile.mkdtemp(prefix="nodus-egress-"))
            os.chmod(self._directory, 0o711)
            self._proxy = EgressProxy(self._directory / "proxy.sock", self._policy, self._record).start()
        return self._proxy.socket_path

    def _record(self, record: EgressRecord) -> None:
        with self._lock:
            self._records.append(record.to_dict())

    def take(self) -> list[dict[str, Any]]:
        """The connections since the last call; waits briefly for those still closing."""
        proxy = self._proxy
        if proxy is None:
            return []
        deadline = time.monotonic() + _SETTLE_SECONDS
        while proxy.open_connections and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._lock:
            taken, self._records = self._records, []
        return taken

    def close(self) -> None:
        if self._proxy is not None:
            self._proxy.close()
            self._proxy = None
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None
