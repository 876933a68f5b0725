"""What the benchmark scripts share: a service of their own, waiting on a condition, filler text.

A benchmark's service is its own in every way a user's is not (decision 34): its own HOME,
storage and sandbox root, and its own Ray head (``NODUS_RAY_TEMP_DIR`` under the service's temp
base, ``NODUS_RAY_PORTS`` a free block of ports), so a benchmark never joins, reconfigures or
stops a service someone else runs on the machine. A script that is a Ray driver connects to
that head (`ray_address`), one that kills the cluster on purpose kills that head alone
(`kill_head`), and the API listens on a port of the head's block (`api_port`).

The scripts run as ``python benchmarks/<name>.py``, so this module is imported by its name
(the script's directory is on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from nodus_ray.local_head import HeadPorts, free_port_block, stop_head

__all__ = [
    "NODUS",
    "api_port",
    "auth_headers",
    "kill_head",
    "nodus_up",
    "ray_address",
    "recorded_cluster",
    "temporary_service",
    "wait_until",
    "words",
]

NODUS = str(Path(sys.executable).parent / "nodus")

T = TypeVar("T")


def auth_headers(env: dict[str, str]) -> dict[str, str]:
    """The operator token `nodus up` stored in the service's home, as a request header."""
    stored = json.loads((Path(env["HOME"]) / ".nodus" / "credentials.json").read_text())
    (entry,) = stored["servers"].values()  # one service per temporary home
    return {"Authorization": f"Bearer {entry['token']}"}


def recorded_cluster(env: dict[str, str]) -> dict[str, object]:
    """What the service's `nodus up` recorded in its home: the head's GCS address and session."""
    recorded: dict[str, object] = json.loads((Path(env["HOME"]) / ".nodus" / "cluster.json").read_text())
    return recorded


def ray_address(env: dict[str, str]) -> str:
    """The GCS address of this service's Ray (never "auto", which may find another's): the one
    its `nodus up` recorded, else ``RAY_ADDRESS`` (a service started elsewhere, ``--reuse``)."""
    try:
        return str(recorded_cluster(env)["ray_address"])
    except (OSError, ValueError, KeyError):
        address = env.get("RAY_ADDRESS", "")
        if not address or address == "auto":
            raise SystemExit("no Ray address: no .nodus/cluster.json in HOME and no RAY_ADDRESS") from None
        return address


def kill_head(env: dict[str, str]) -> int:
    """What ``ray stop --force`` does, to this service's head alone: every process of it killed
    at once (GCS, raylet, workers, the API). Returns how many processes were killed."""
    cluster = recorded_cluster(env)
    return stop_head(str(cluster["session_dir"]), str(cluster["ray_address"]), force=True)


def api_port(env: dict[str, str], offset: int = 0) -> int:
    """A free port for the API: in the service's own block, which Ray leaves unused (its base
    +20..+29 were checked free with the block; the tests' session uses the same port)."""
    return HeadPorts(int(env["NODUS_RAY_PORTS"])).api + offset


def nodus_up(env: dict[str, str]) -> int:
    """Start the service of ``env`` (`temporary_service`) with `nodus up`; its API port, or
    exit saying why it did not start."""
    port = api_port(env)
    up = subprocess.run(
        [NODUS, "up", "--port", str(port)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    if up.returncode != 0:
        sys.exit(f"nodus up failed:\n{up.stdout}\n{up.stderr}")
    return port


def wait_until(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll ``condition`` until it returns something truthy; exit the script after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            sys.exit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def words(rng: random.Random, chars: int, vocabulary: Sequence[str]) -> str:
    """About ``chars`` characters of words drawn from ``vocabulary``."""
    parts: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(vocabulary)
        parts.append(word)
        size += len(word) + 1
    return " ".join(parts)[:chars].strip()


@contextmanager
def temporary_service(prefix: str, **settings: str) -> Iterator[dict[str, str]]:
    """The environment of a nodus with its own home, storage, sandbox root and Ray head (its
    temp dir and a free block of ports), plus ``settings`` (e.g. ``NODUS_OFFLINE_LATENCY``);
    `nodus down` (which ends that head alone) and the files removed after. The caller runs
    ``nodus up --port api_port(env)`` with it (some benchmarks restart it on purpose)."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o711)  # sandboxed commands run as another uid and must traverse to their workspace
    for part in ("home", "storage", "sandboxes"):
        (base / part).mkdir(mode=0o711)
    env = {
        **os.environ,
        "HOME": str(base / "home"),
        "NODUS_STORAGE": str(base / "storage"),
        "NODUS_SANDBOX_ROOT": str(base / "sandboxes"),
        "NODUS_RAY_TEMP_DIR": str(base / "ray"),
        "NODUS_RAY_PORTS": str(free_port_block()),
        "RAY_USAGE_STATS_ENABLED": "0",
        **settings,
    }
    for inherited in ("ANTHROPIC_API_KEY", "RAY_ADDRESS", "NODUS_API_URL", "NODUS_CREDENTIALS_FILE"):
        if inherited not in settings:
            env.pop(inherited, None)  # the caller's service, key or credentials: never this one's
    try:
        yield env
    finally:
        subprocess.run([NODUS, "down"], env=env, capture_output=True, check=False)
        shutil.rmtree(base, ignore_errors=True)
