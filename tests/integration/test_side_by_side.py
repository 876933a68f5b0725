"""Two nodus services on one machine: a user's own and the test session's never meet.

A user runs `make demo` (which leaves their service up) and then `make test`, or runs the tests
while they work. The session's service must not join, reconfigure or stop theirs, and theirs
must not be stopped by anything the session does. Here a second service plays the user's: it is
started with `nodus up` as a user would (its own HOME, storage and Ray, and a Ray token in that
HOME, as a local `ray.init()` leaves one), runs the hello example,
sees the session's service restarted next to it, and is stopped with `nodus down`, which must
leave the session's cluster exactly as it was.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from nodus_ray.local_head import HeadPorts, free_port_block, head_processes

from .conftest import NODUS, Server, wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hello"


@dataclass(frozen=True)
class Service:
    env: dict[str, str]
    home: Path

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [NODUS, *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def cluster(self) -> dict[str, str]:
        recorded: dict[str, str] = json.loads((self.home / ".nodus" / "cluster.json").read_text())
        return recorded


def _gcs_pid(temp_dir: str) -> int | None:
    """The pid of the GCS server whose session lives under ``temp_dir``: one per Ray cluster."""
    for process in psutil.process_iter(["name", "cmdline"]):
        if process.info["name"] == "gcs_server" and temp_dir in " ".join(process.info["cmdline"] or []):
            return process.pid
    return None


@pytest.fixture
def users_service(server: Server) -> Iterator[Service]:
    """A second service started the way a user starts theirs, beside the session's."""
    base = Path(tempfile.mkdtemp(prefix="nodus-user-"))
    base.chmod(0o711)  # the sandbox's uid traverses down to its workspaces
    for part in ("home", "storage", "sandboxes"):
        (base / part).mkdir(mode=0o711)
    block = free_port_block()
    env = {
        key: value
        for key, value in server.env.items()
        if not key.startswith("NODUS_") and key not in ("RAY_ADDRESS", "ANTHROPIC_BASE_URL")
    }
    env.update(
        HOME=str(base / "home"),
        NODUS_STORAGE=str(base / "storage"),
        NODUS_SANDBOX_ROOT=str(base / "sandboxes"),
        NODUS_RAY_TEMP_DIR=str(base / "ray"),
        NODUS_RAY_PORTS=str(block),
        NODUS_RUN_POOL="0",
        NODUS_API_URL=f"http://127.0.0.1:{HeadPorts(block).api}",
    )
    # A user who once ran `ray.init()` on this machine has a Ray token in their HOME: Ray's
    # `ray start` then turns token auth on, and `nodus up` must join the head it started.
    (base / "home" / ".ray").mkdir(mode=0o700)
    (base / "home" / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    service = Service(env=env, home=base / "home")
    up = service.cli("up", "--port", str(HeadPorts(block).api))
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield service
    finally:
        if (service.home / ".nodus" / "cluster.json").exists():
            service.cli("down")
        shutil.rmtree(base, ignore_errors=True)


def test_a_users_service_and_the_sessions_never_join_reconfigure_or_stop_each_other(
    server: Server, users_service: Service
) -> None:
    ours_dir, theirs_dir = server.env["NODUS_RAY_TEMP_DIR"], users_service.env["NODUS_RAY_TEMP_DIR"]
    ours_gcs, theirs_gcs = _gcs_pid(ours_dir), _gcs_pid(theirs_dir)
    assert ours_gcs and theirs_gcs and ours_gcs != theirs_gcs, "each service has its own Ray cluster"
    theirs = users_service.cluster()
    assert theirs["started_ray"] and theirs["ray_address"] != server.ray_address

    # The user's service works as theirs: the hello example, on their own storage.
    assert users_service.cli("apply", "-f", str(EXAMPLES / "agent.yaml")).returncode == 0
    assert users_service.cli("apply", "-f", str(EXAMPLES / "run.yaml")).returncode == 0
    waited = users_service.cli(
        "wait", "agentrun/hello-agent-run", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=3m"
    )
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert any((Path(users_service.env["NODUS_STORAGE"]) / "projects").rglob("run.json"))

    # `nodus up` of the session again (a restart, a new key...) reattaches to the session's own
    # cluster, never to the user's, and changes nothing of theirs.
    again = server.up()
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"Ray       {server.ray_address}" in again.stdout
    assert _gcs_pid(theirs_dir) == theirs_gcs and users_service.cluster() == theirs
    answer = users_service.cli("agentrun", "answer", "hello-agent-run")
    assert answer.returncode == 0 and "Python 3." in answer.stdout

    # The user's `nodus down` stops their cluster, all of it, and nothing of the session's.
    theirs_before = [p.pid for p in head_processes(theirs["session_dir"], theirs["ray_address"])]
    assert len(theirs_before) > 5, "the head's daemons, agents and workers"
    down = users_service.cli("down")
    assert down.returncode == 0 and "stopped the local Ray cluster" in down.stdout, down.stdout + down.stderr
    wait_for(
        lambda: not any(psutil.pid_exists(pid) for pid in theirs_before),
        timeout=60,
        message="every process of the user's cluster to end",
    )
    assert _gcs_pid(ours_dir) == ours_gcs, "the session's cluster kept running"
    with server.http() as http:
        assert http.get("/readyz").json()["status"] == "ready"
    assert os.path.exists(users_service.env["NODUS_STORAGE"]), "storage is kept"
