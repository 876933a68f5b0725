"""One real Ray cluster and one Serve app for the whole integration session.

The session runs `nodus up` exactly as a user does (the CLI, a local Ray head, the Serve app)
with its own storage, sandbox root and home, and `nodus down` at the end. Starting Ray costs
about 10 s and each actor 0.65 s on these machines, so nothing here starts a cluster per test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

NODUS = str(Path(sys.executable).parent / "nodus")
PORT = int(os.environ.get("NODUS_TEST_PORT", "18000"))


@dataclass(frozen=True)
class Server:
    api_url: str
    storage: Path
    sandbox_root: Path
    env: dict[str, str]

    def cli(self, *args: str, input: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """Run the `nodus` CLI against this server, as a user would."""
        return subprocess.run([NODUS, *args], env=self.env, input=input, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.api_url, timeout=30.0)

    def up(self, **extra_env: str) -> subprocess.CompletedProcess[str]:
        """`nodus up` again on the running service, e.g. with ANTHROPIC_API_KEY set or cleared."""
        env = {**self.env, **extra_env}
        return subprocess.run([NODUS, "up", "--port", str(PORT)], env={k: v for k, v in env.items() if v},
                              capture_output=True, text=True, timeout=180, check=False)


def wait_for(condition: Callable[[], Any], *, timeout: float = 60.0, interval: float = 0.05,
             message: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def fake_anthropic() -> Iterator[Any]:
    """A local fake of the Anthropic Messages API that every Claude call of the session reaches
    (the server's ANTHROPIC_BASE_URL points at it); runs without a key stay on the offline model."""
    from tests.fakes.anthropic_api import FakeMessagesAPI

    fake = FakeMessagesAPI().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(scope="session")
def server(fake_anthropic: Any) -> Iterator[Server]:
    base = Path(tempfile.mkdtemp(prefix="nodus-it-"))
    # The sandbox runs as an unprivileged uid that must traverse down to its workspace.
    base.chmod(0o711)
    storage, sandboxes, home = base / "storage", base / "sandboxes", base / "home"
    for path in (storage, sandboxes, home):
        path.mkdir(mode=0o711)
    env = {
        **os.environ,
        "HOME": str(home),
        "NODUS_STORAGE": str(storage),
        "NODUS_SANDBOX_ROOT": str(sandboxes),
        "NODUS_OFFLINE_LATENCY": "0.3",
        "NODUS_INITIAL_CREDITS": "1.00",
        "ANTHROPIC_BASE_URL": fake_anthropic.base_url,
        "NODUS_API_URL": f"http://127.0.0.1:{PORT}",
        "NODUS_PROJECT": "default",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("ANTHROPIC_API_KEY", None)
    up = subprocess.run([NODUS, "up", "--port", str(PORT)], env=env, capture_output=True, text=True,
                        timeout=300, check=False)
    if up.returncode != 0:
        pytest.fail(f"nodus up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
    try:
        yield Server(api_url=f"http://127.0.0.1:{PORT}", storage=storage, sandbox_root=sandboxes, env=env)
    finally:
        subprocess.run([NODUS, "down"], env=env, capture_output=True, text=True, timeout=180, check=False)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def sdk_env(server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    """The SDK in this process, configured the documented way (environment variables)."""
    monkeypatch.setenv("NODUS_API_URL", server.api_url)
    monkeypatch.setenv("NODUS_PROJECT", "default")
    return server


@pytest.fixture(scope="session")
def ray_driver(server: Server) -> Iterator[Any]:
    """A Ray driver connected to the session's cluster, for tests that break actors on purpose."""
    import ray

    ray.init(address="auto", namespace="nodus", logging_level="ERROR", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
