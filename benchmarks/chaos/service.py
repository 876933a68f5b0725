"""The campaign's own nodus: its own HOME, storage (a directory, or a bucket of a moto S3 server
it starts), sandbox root, Ray temp dir and port block, so nothing of a user's service or of
``/tmp/ray`` is ever touched. Killing "the cluster" kills this head alone
(`nodus_ray.local_head.stop_head` of its recorded session), and every pid the fault driver
signals is first checked to be a process of this head (or of the second node it started).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from nodus_ray.local_head import HeadPorts, free_port_block, head_processes, stop_head
from nodus_ray.store.storage import Storage

from .fake_claude import FakeClaude

__all__ = ["NODUS", "Service", "own_service"]

NODUS = str(Path(sys.executable).parent / "nodus")
RETRYABLE = (500, 502, 503, 504)


@dataclass
class Service:
    base: Path
    env: dict[str, str]
    port: int
    fake: FakeClaude
    server_errors: list[str] = field(default_factory=list)  # 500s seen (retried, but worth a look)
    proxy_404s: int = 0  # Serve's own 404 while the app starts (retried)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_uri(self) -> str:
        return self.env["NODUS_STORAGE"]

    @property
    def sandbox_root(self) -> Path:
        return Path(self.env["NODUS_SANDBOX_ROOT"])

    def store(self) -> Storage:
        return Storage(self.storage_uri)

    def cluster(self) -> dict[str, Any]:
        recorded: dict[str, Any] = json.loads(
            (Path(self.env["HOME"]) / ".nodus" / "cluster.json").read_text()
        )
        return recorded

    def token(self) -> str:
        stored = json.loads((Path(self.env["HOME"]) / ".nodus" / "credentials.json").read_text())
        return str(stored["servers"][self.api_url]["token"])

    def up(self) -> None:
        """`nodus up`, as a user runs it; then this process's Ray state API means this head."""
        done = subprocess.run(
            [NODUS, "up", "--port", str(self.port)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"nodus up failed ({done.returncode}): {done.stdout}{done.stderr}")
        address = str(self.cluster()["ray_address"])
        self.env["RAY_ADDRESS"] = address
        os.environ["RAY_ADDRESS"] = address  # ray.util.state finds this cluster, never /tmp/ray's

    def kill_head(self) -> int:
        """`ray stop --force`, on this head alone."""
        cluster = self.cluster()
        return int(stop_head(str(cluster["session_dir"]), str(cluster["ray_address"]), force=True))

    def own_pids(self) -> set[int]:
        cluster = self.cluster()
        return {p.pid for p in head_processes(str(cluster["session_dir"]), str(cluster["ray_address"]))}

    def http(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.api_url, timeout=timeout, headers={"Authorization": f"Bearer {self.token()}"}
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        key: str | None = None,
        params: dict[str, str] | None = None,
        patience: float = 150.0,
    ) -> httpx.Response | None:
        """One request, sent again (with the same idempotency key) while the service is down or
        answers 5xx, for up to ``patience`` seconds; None if it never answered below 500."""
        deadline = time.monotonic() + patience
        headers = {"Idempotency-Key": key} if key else {}
        while True:
            try:
                with self.http() as http:
                    response = http.request(method, path, json=body, headers=headers, params=params)
                if response.status_code == 404 and "not found. Ping" in response.text:
                    # Serve's proxy is up and the API's routes are not (yet): no answer from nodus.
                    self.proxy_404s += 1
                elif response.status_code not in RETRYABLE:
                    return response
                if response.status_code == 500:
                    self.server_errors.append(f"{method} {path}: {response.text[:200]}")
            except (httpx.HTTPError, OSError, KeyError, ValueError):
                pass  # down (restarting), or the credentials file mid-rewrite by `nodus up`
            if time.monotonic() > deadline:
                return None
            time.sleep(1.0)

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        response = self.request("GET", path, params=params)
        if response is None or response.status_code != 200:
            raise RuntimeError(f"GET {path}: {response.status_code if response else 'no answer'}")
        return response.json()

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "NODUS_API_URL": self.api_url, "NODUS_PROJECT": "default"}
        return subprocess.run(
            [NODUS, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )


def _s3(base: Path) -> tuple[dict[str, str], Any]:
    """A moto S3 server of our own (this process), a bucket on it, and the env that points at it."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    moto.start()
    host, port = moto.get_host_and_port()
    credentials = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    os.environ.update(credentials)  # the checker reads the bucket from this process
    pafs.S3FileSystem(
        endpoint_override=f"{host}:{port}",
        scheme="http",
        region="us-east-1",
        access_key="testing",
        secret_key="testing",
        allow_bucket_creation=True,
    ).create_dir("nodus-chaos")
    uri = f"s3://nodus-chaos/storage?endpoint_override={host}:{port}&scheme=http&region=us-east-1"
    return {**credentials, "NODUS_STORAGE": uri}, moto


@contextmanager
def own_service(storage: str) -> Iterator[Service]:
    """A nodus of the campaign's own, up; everything it started ended and removed after."""
    base = Path(tempfile.mkdtemp(prefix="nodus-chaos-"))
    base.chmod(0o711)  # sandboxed commands run as another uid and must traverse to their workspace
    for part in ("home", "storage", "sandboxes", "work"):
        (base / part).mkdir(mode=0o711)
    fake = FakeClaude().start()
    moto = None
    previous = {k: os.environ.get(k) for k in ("RAY_ADDRESS", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    inherited = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NODUS_", "ANTHROPIC_", "AWS_")) and k not in ("RAY_ADDRESS", "RAY_TMPDIR")
    }
    ports = free_port_block()
    env = {
        **inherited,
        "HOME": str(base / "home"),
        "NODUS_STORAGE": str(base / "storage"),
        "NODUS_SANDBOX_ROOT": str(base / "sandboxes"),
        "NODUS_RAY_TEMP_DIR": str(base / "ray"),
        "NODUS_RAY_PORTS": str(ports),
        "NODUS_OFFLINE_LATENCY": "0.3",
        "NODUS_INITIAL_CREDITS": "100.00",
        "ANTHROPIC_BASE_URL": fake.base_url,
        "RAY_USAGE_STATS_ENABLED": "0",
        # A node that stops answering is declared dead in seconds, not a minute, so a frozen
        # second node's runs get replacements (and its actors become zombies) within the campaign.
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_timeout_ms": "2000",
        "RAY_health_check_failure_threshold": "4",
    }
    service = Service(base=base, env=env, port=HeadPorts(ports).api, fake=fake)
    try:
        if storage == "s3":
            settings, moto = _s3(base)
            env.update(settings)
        service.up()
        yield service
    finally:
        subprocess.run([NODUS, "down"], env=env, capture_output=True, text=True, timeout=180, check=False)
        try:  # whatever `nodus down` left of this head (never anything else)
            service.kill_head()
        except (OSError, ValueError, KeyError):
            pass
        fake.stop()
        if moto is not None:
            moto.stop()
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if os.environ.get("NODUS_CHAOS_KEEP"):
            print(f"kept {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
