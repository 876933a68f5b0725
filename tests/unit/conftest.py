"""Storage backends for unit tests: a local directory and S3 through a local S3-compatible server.

The S3 server is moto's, started once per session on a free port; tests that take the
``storage_uri`` fixture run against both backends through the same `pyarrow.fs` code path the
engine uses.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    server = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if server is None:
        pytest.fail("moto_server is not installed; `pip install -e .[test]` installs it")
    port = _free_port()
    process = subprocess.Popen(
        [server, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    endpoint = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://{endpoint}/", timeout=1.0)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                pytest.fail("the local S3 server did not start")
            time.sleep(0.05)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    try:
        yield endpoint
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(params=["local", "s3"])
def storage_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty storage root on each backend."""
    if request.param == "local":
        return str(tmp_path / "storage")
    import pyarrow.fs as pafs

    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"nodus-{uuid.uuid4().hex[:12]}"
    pafs.S3FileSystem(
        endpoint_override=endpoint, scheme="http", region="us-east-1", allow_bucket_creation=True
    ).create_dir(bucket)
    return f"s3://{bucket}/prefix?endpoint_override={endpoint}&scheme=http&region=us-east-1"


@pytest.fixture(autouse=True)
def _no_stored_credentials(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token the developer's `nodus up` stored must not reach a unit test's client."""
    monkeypatch.setenv(
        "NODUS_CREDENTIALS_FILE", str(tmp_path_factory.mktemp("credentials") / "credentials.json")
    )
    monkeypatch.delenv("NODUS_TOKEN", raising=False)


@pytest.fixture(autouse=True, scope="session")
def _no_ray_cluster() -> Iterator[None]:
    """Unit tests run with no Ray cluster: one that starts Ray belongs in tests/integration."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        pytest.fail("a unit test started Ray; unit tests must run without a cluster")
