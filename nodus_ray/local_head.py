"""The local Ray head that ``nodus up`` starts, kept apart from every other Ray on the machine.

Several Ray clusters can share one machine (a user's own service, a test session, a benchmark)
as long as each has its own temp dir and ports. ``ray stop`` cannot tell them apart: it ends
every Ray process on the machine. So a head started here is identified by its *session
directory* (unique per start, named on the command line of its GCS, raylet, dashboard and
monitors) and by its GCS port (the Ray client server), and stopping it ends those processes
and their descendants (the workers, the agents), nothing else.

Where the head lives comes from `settings.HeadSettings` (``NODUS_RAY_TEMP_DIR``,
``NODUS_RAY_PORTS``): unset, Ray's own defaults.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from nodus.errors import Unavailable
from nodus_ray.settings import HeadSettings

__all__ = [
    "settle_ray_auth_mode",
    "HeadPorts",
    "free_port_block",
    "start_head",
    "stop_head",
    "head_processes",
]

# The server's secrets reach the control plane over RPC; no Ray worker inherits them.
_WITHHELD_FROM_WORKERS = ("ANTHROPIC_API_KEY", "NODUS_SECRET_KEY")
_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class HeadPorts:
    """Every port a Ray head listens on, laid out from one base so one number isolates a head.

    Ray's defaults are fixed ports (6379, 8265, 10001, 52365, ...) and one shared worker range,
    which two heads on one machine would fight over.
    """

    base: int

    @property
    def dashboard(self) -> int:
        return self.base + 1

    @property
    def api(self) -> int:
        """A port of the block Ray leaves alone (+20..+29 are checked free with the block): for
        the service's own HTTP API, so a second service needs only its base to be apart."""
        return self.base + 20

    def args(self) -> list[str]:
        b = self.base
        return [
            f"--port={b}",
            f"--dashboard-port={self.dashboard}",
            f"--ray-client-server-port={b + 2}",
            f"--dashboard-agent-listen-port={b + 3}",
            f"--dashboard-agent-grpc-port={b + 4}",
            f"--metrics-export-port={b + 5}",
            f"--runtime-env-agent-port={b + 6}",
            f"--node-manager-port={b + 7}",
            f"--object-manager-port={b + 8}",
            f"--min-worker-port={b + 100}",
            f"--max-worker-port={b + PORT_SPAN - 1}",
        ]


PORT_SPAN = 1000  # a head's ports: the base and the 999 after it


def _block_is_free(base: int) -> bool:
    """Whether nothing listens on the block's fixed ports (Ray skips busy worker ports itself)."""
    for port in (*range(base, base + 30), base + 100, base + PORT_SPAN - 1):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                return False
    return True


def free_port_block(low: int = 20000, high: int = 32000) -> int:
    """A base for ``NODUS_RAY_PORTS`` whose block is free: for a second service on a machine
    (a test session, a benchmark). The default range lies below Linux's ephemeral ports and
    above Ray's default worker ports, so neither a client socket nor another head takes them."""
    blocks = list(range(low, high, PORT_SPAN))
    random.shuffle(blocks)
    for base in blocks:
        if _block_is_free(base):
            return base
    raise RuntimeError(f"no free block of {PORT_SPAN} ports between {low} and {high}")


def _ray_executable() -> str:
    candidate = Path(sys.executable).parent / "ray"
    return str(candidate) if candidate.exists() else "ray"


def settle_ray_auth_mode() -> None:
    """Say Ray's token-auth mode once, for the head this service starts and every driver of it.

    Ray 2.60's ``ray start --head`` turns token auth on when it finds a token (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``, which any local ``ray.init()`` writes), but a
    driver that joins a running cluster sends the token only when ``RAY_AUTH_MODE=token`` says
    so: on a machine where someone once ran ``ray.init()``, `nodus up` started a head it could not
    join. With a token there and no mode set, the mode is "token" for this process and the head
    (whose workers inherit it); an explicit ``RAY_AUTH_MODE`` is left as it is.
    """
    if "RAY_AUTH_MODE" in os.environ:
        return
    # Ray's own rule, as ``ray start`` applies it; it also reloads Ray's config in this process,
    # which read the mode when Ray was imported (setting the variable alone is not enough).
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )

    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def start_head(head: HeadSettings) -> None:
    """``ray start --head`` with this service's temp dir and ports; a clear error if it fails."""
    command = [
        _ray_executable(),
        "start",
        "--head",
        "--disable-usage-stats",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
    ]
    if head.temp_dir:
        Path(head.temp_dir).mkdir(parents=True, exist_ok=True)
        command.append(f"--temp-dir={head.temp_dir}")
    if head.port_base is not None:
        command += HeadPorts(head.port_base).args()
    environment = {k: v for k, v in os.environ.items() if k not in _WITHHELD_FROM_WORKERS}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if "Error" in line or "error" in line), None)
        raise Unavailable(f"`ray start --head` failed: {(reason or (lines or ['no output'])[-1]).strip()}")


def head_processes(session_dir: str, gcs_address: str) -> list[psutil.Process]:
    """The processes of the head whose session is ``session_dir``, with all their descendants.

    Ray's daemons name the session directory on their command lines; the client server names
    only the GCS address. Workers and agents are children of the raylet.
    """
    port = gcs_address.rpartition(":")[2]
    roots: list[psutil.Process] = []
    for process in psutil.process_iter(["cmdline"]):
        words = process.info["cmdline"] or []
        line = " ".join(words)
        if session_dir in line:
            roots.append(process)
        elif "ray.util.client.server" in line and any(w.endswith(f":{port}") for w in words):
            roots.append(process)
    found: dict[int, psutil.Process] = {}
    for root in roots:
        found[root.pid] = root
        try:
            for child in root.children(recursive=True):
                found[child.pid] = child
        except psutil.NoSuchProcess:
            continue
    found.pop(os.getpid(), None)
    return list(found.values())


def stop_head(session_dir: str, gcs_address: str, *, force: bool = False) -> int:
    """End the head of ``session_dir`` and nothing else; returns how many processes were ended.

    ``force`` kills at once (what ``ray stop --force`` does to a whole machine); otherwise each
    process gets SIGTERM and a grace period first.
    """
    processes = head_processes(session_dir, gcs_address)
    first = signal.SIGKILL if force else signal.SIGTERM
    for process in processes:
        try:
            process.send_signal(first)
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(processes, timeout=_GRACE_SECONDS)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=_GRACE_SECONDS)
    return len(processes)
