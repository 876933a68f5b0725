"""One run's way out: its egress proxy, started with its sandbox, and the connections it saw.

A run whose Agent lists ``spec.network.allowedHosts`` gets its own `egress.EgressProxy` on a
Unix socket that only its sandbox has bound in. Each connection is recorded when it ends; the
records are handed to the command that made them and journaled with its result, so they are
as durable as the command itself, and the events stream shows each one (`egress` events).

A command that is interrupted never gets a result to journal them with, and it is exactly
then that a person needs them: such a command may have reached the outside and its run waits
for that person to decide (``NeedsResolution``). So, with storage given, the connections of
the command running now are also written as they happen, when each opens and when it ends,
to one object per command (`layout.command_egress`, keyed by its ``Started`` seq). The object
is written empty when the command starts, so "no connections" can be told from "not known".
Only host, port, outcome, reason, bytes and times are kept; never a path, header or body.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from nodus.egress_policy import EgressPolicy
from nodus_ray.egress.proxy import EgressProxy, EgressRecord
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage

__all__ = ["RunEgress", "read_command_egress"]

logger = logging.getLogger(__name__)

_SETTLE_SECONDS = 2.0  # after a command, how long its closing connections get to be recorded


def _identity(entry: dict[str, Any]) -> tuple[Any, ...]:
    """What tells one connection's open entry from another's (a record has no id of its own)."""
    return (entry.get("startedAt"), entry.get("host"), entry.get("port"), entry.get("method"))


def read_command_egress(storage: Storage, run_prefix: str, seq: int) -> list[dict[str, Any]] | None:
    """The connections the command started at journal ``seq`` made, as far as they were
    written (each with ``ended``: False for one still open when its actor stopped); None when
    nothing was written (the actor stopped before the command ran, or the run has no proxy)."""
    key = layout.command_egress(run_prefix, seq)
    if not storage.exists(key):
        return None
    document = storage.read_json(key)
    connections = document.get("connections") if isinstance(document, dict) else None
    return list(connections) if isinstance(connections, list) else None


class RunEgress:
    def __init__(
        self,
        allowed_hosts: list[str],
        private_networks: str,
        *,
        storage: Storage | None = None,
        run_prefix: str | None = None,
    ) -> None:
        self._policy = EgressPolicy.from_settings(allowed_hosts, private_networks)
        self._records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._proxy: EgressProxy | None = None
        self._directory: Path | None = None
        self._storage = storage
        self._run_prefix = run_prefix
        self._command: int | None = None  # the Started seq of the command whose evidence is written
        self._evidence: list[dict[str, Any]] = []

    def begin(self, seq: int) -> None:
        """The command journaled as started at ``seq`` runs now: write its (empty) evidence.

        Call before the command runs; from then until the next `begin`, each connection is
        written to that command's object as it opens and as it ends.
        """
        with self._lock:
            self._command, self._evidence = seq, []
            self._write_evidence()

    def _write_evidence(self) -> None:
        """Rewrite the current command's object (called with the lock held). A command makes
        few connections, so rewriting the whole list keeps each write one plain put (S3 has no
        append), and the object always holds a complete JSON document."""
        if self._storage is None or self._run_prefix is None or self._command is None:
            return
        try:
            self._storage.write_json(
                layout.command_egress(self._run_prefix, self._command),
                {"command": self._command, "connections": list(self._evidence)},
            )
        except Exception:  # noqa: BLE001 - the command goes on; its evidence then reads as unknown
            logger.warning("could not write the egress records of command %s", self._command, exc_info=True)

    def _opened(self, record: EgressRecord) -> None:
        with self._lock:
            if self._command is not None:
                self._evidence.append({**record.to_dict(), "ended": False})
                self._write_evidence()

    def start(self) -> Path:
        """Listen, and return the host path of the socket to bind into the sandbox."""
        if self._proxy is None:
            # A short path: a Unix socket's path is limited to 107 bytes. 0711: the sandbox's
            # uid reaches the socket inside it through bubblewrap's bind, never by listing.
            self._directory = Path(tempfile.mkdtemp(prefix="nodus-egress-"))
            os.chmod(self._directory, 0o711)
            self._proxy = EgressProxy(
                self._directory / "proxy.sock", self._policy, self._record, on_open=self._opened
            ).start()
        return self._proxy.socket_path

    def _record(self, record: EgressRecord) -> None:
        entry = record.to_dict()
        with self._lock:
            self._records.append(entry)
            if self._command is not None:
                same = _identity(entry)
                self._evidence = [e for e in self._evidence if e.get("ended") or _identity(e) != same]
                self._evidence.append({**entry, "ended": True})
                self._write_evidence()

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
