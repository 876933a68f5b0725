"""One real Ray cluster and one Serve app for the whole integration session.

The session runs `nodus up` exactly as a user does (the CLI, a local Ray head, the Serve app)
with its own storage, sandbox root and home, and `nodus down` at the end. Starting Ray costs
about 10 s and each actor 0.65 s on these machines, so nothing here starts a cluster per test.

The session's Ray is its own: its own temp dir and a block of free ports (``NODUS_RAY_TEMP_DIR``,
``NODUS_RAY_PORTS``), so a user's `nodus up` on the same machine (or another test session) is
never joined, reconfigured or stopped, and `nodus down` ends this session's head alone.
Crash points (``NODUS_FAULTS``) are armed only in a session that runs the fault suite.

``NODUS_TEST_STORAGE=s3`` runs the session on S3 instead of a local directory: a local
S3-compatible server (moto's server mode) that the session starts, where nothing can be
appended. Tests that look at storage use `Server.store`, so they pass on either.

Everything the session keeps (storage, the sandbox root, its home with the secret key, Ray's
temp dir) lives under one directory outside ``/tmp`` (``/var/tmp`` unless
``NODUS_TEST_BASE_DIR`` says otherwise): a sandbox's ``/tmp`` is private, so under ``/tmp`` those
paths would be absent from every sandbox whether the server hides them or not, and a regression
that exposed them would stay green. The fake Anthropic API is shared by the session and reset
before every test.
"""

from __future__ import annotations

import json
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
from typing import Any, Literal

import httpx
import pytest

from nodus_ray.local_head import HeadPorts, free_port_block
from tests.fakes.rate_limits import session_rate_limits

NODUS = str(Path(sys.executable).parent / "nodus")
RAY_PORTS = int(os.environ.get("NODUS_TEST_RAY_PORTS") or free_port_block())
PORT = int(os.environ.get("NODUS_TEST_PORT") or HeadPorts(RAY_PORTS).api)  # Serve's HTTP proxy
DASHBOARD_URL = f"http://127.0.0.1:{HeadPorts(RAY_PORTS).dashboard}"
# The files of the fault-injection suite: a session that collects one of them arms crash points.
FAULT_SUITES = ("test_faults.py", "test_faults_python.py")
# The one project whose retention is seconds (`test_retention`); every other keeps the defaults.
RETENTION_PROJECT = "retention-it"


@dataclass(frozen=True)
class Server:
    api_url: str
    storage: Path
    sandbox_root: Path
    env: dict[str, str]
    faults: Path
    storage_uri: str  # NODUS_STORAGE: the local directory `storage`, or an s3:// URI
    token: str  # the operator token `nodus up` stored for the session's user (every project, admin)
    home: Path  # the session user's HOME: ~/.nodus holds the token and what `nodus up` started
    dashboard_url: str = DASHBOARD_URL

    def cluster(self) -> dict[str, Any]:
        """What the latest `nodus up` recorded: the head's GCS address and its session directory
        (a new one after each restart of the head), which identifies the head's processes."""
        recorded: dict[str, Any] = json.loads((self.home / ".nodus" / "cluster.json").read_text())
        return recorded

    @property
    def ray_address(self) -> str:
        return str(self.cluster()["ray_address"])

    def kill_cluster(self) -> int:
        """What `ray stop --force` does, to this session's Ray alone: every process of the head
        killed at once (GCS, raylet, workers). A user's Ray on the machine is left running."""
        from nodus_ray.local_head import stop_head

        cluster = self.cluster()
        return stop_head(cluster["session_dir"], cluster["ray_address"], force=True)

    def store(self) -> Any:
        """The service's storage, read the way the service reads it (local disk or S3)."""
        from nodus_ray.store.storage import Storage

        return Storage(self.storage_uri)  # NODUS_FAULTS of the service: arm a crash point with `arm`

    def arm(self, point: str, context: str, action: Literal["kill", "hold"] = "kill") -> Path:
        """Make the first process of the service that reaches ``point`` for ``context`` die
        there (``hold``: wait there until `release`)."""
        from nodus_ray.faults import arm

        if "NODUS_FAULTS" not in self.env:
            raise RuntimeError("crash points are armed only in a session that runs the fault suite")

        return arm(self.faults, point, context, action)

    def release(self, point: str) -> None:
        """Let the process held at ``point`` go on."""
        from nodus_ray.faults import release

        release(self.faults, point)

    def fired_context(self, point: str) -> str | None:
        """The context (ending `` node=<id>``) of the process that fired ``point``, once it has."""
        from nodus_ray.faults import fired_context

        return fired_context(self.faults, point)

    def fired(self, point: str) -> bool:
        return any(self.faults.glob(f".{point}.fired.*"))

    @property
    def base(self) -> Path:
        """The session's own directory, which holds storage, sandboxes, home and Ray's temp dir."""
        return self.home.parent

    def ray_logs(self) -> list[Path]:
        """Every log file of this session's Ray, recursively, for leak scans.

        Each head session of the run (``nodus up`` after a `ray stop --force` starts a new one)
        under ``NODUS_RAY_TEMP_DIR``: GCS, raylet, every worker's (the control plane, run actors,
        the grader) and Serve's (``logs/serve``: the proxy, the controller, the replicas).
        """
        temp_dir = Path(self.env["NODUS_RAY_TEMP_DIR"])
        sessions = [s for s in temp_dir.glob("session_*") if s.is_dir() and not s.is_symlink()]
        logs = [path for s in sessions for path in (s / "logs").rglob("*") if path.is_file()]
        assert logs, f"no Ray log files under {temp_dir}"
        return logs

    def cli(
        self, *args: str, input: str | None = None, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        """Run the `nodus` CLI against this server, as a user would."""
        return subprocess.run(
            [NODUS, *args],
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def http(self, token: str | None = None) -> httpx.Client:
        """Raw HTTP to the API with the operator token, or ``token`` (``""``: none at all)."""
        token = self.token if token is None else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.api_url, timeout=30.0, headers=headers)

    def up(self, **extra_env: str) -> subprocess.CompletedProcess[str]:
        """`nodus up` again on the running service, e.g. with ANTHROPIC_API_KEY set or cleared."""
        env = {**self.env, **extra_env}
        return subprocess.run(
            [NODUS, "up", "--port", str(PORT)],
            env={k: v for k, v in env.items() if v},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )


def wait_for(
    condition: Callable[[], Any], *, timeout: float = 60.0, interval: float = 0.05, message: str = "condition"
) -> Any:
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


def _session_base() -> Path:
    """A fresh directory for the session, on a path a sandbox would see if nothing hid it.

    Not under ``/tmp`` (private in every sandbox) nor under a home directory (the server user's
    home is hidden by default): ``/var/tmp``, or ``NODUS_TEST_BASE_DIR``. Mode 0o711: the
    sandbox runs as an unprivileged uid that must traverse down to its workspace.
    """
    parent = Path(os.environ.get("NODUS_TEST_BASE_DIR") or "/var/tmp").resolve()
    if parent == Path("/tmp") or Path("/tmp") in parent.parents:
        raise RuntimeError(f"NODUS_TEST_BASE_DIR must not be under /tmp (got {parent})")
    base = Path(tempfile.mkdtemp(prefix="nodus-it-", dir=parent))
    base.chmod(0o711)
    return base


@pytest.fixture(scope="session")
def fake_anthropic() -> Iterator[Any]:
    """A local fake of the Anthropic Messages API that every Claude call of the session reaches
    (the server's ANTHROPIC_BASE_URL points at it); runs without a key stay on the offline model.
    One for the session (the server is configured with its address); `_fresh_fake_anthropic`
    resets it before each test."""
    from tests.fakes.anthropic_api import FakeMessagesAPI

    fake = FakeMessagesAPI().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(autouse=True)
def _fresh_fake_anthropic(fake_anthropic: Any) -> Iterator[None]:
    """Each test starts with an empty script, the echo responder, any key accepted and no
    recorded requests, whatever the test before it scripted or left unserved."""
    fake_anthropic.reset()
    yield
    fake_anthropic.reset()


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[Any]:
    """Where the session's service exports its traces (OTEL_EXPORTER_OTLP_ENDPOINT), for test_traces."""
    from tests.fakes.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture(scope="session")
def storage_service() -> Iterator[dict[str, str]]:
    """Where the session's storage lives: {} for a local directory, or the environment that
    points NODUS_STORAGE at a bucket of a local S3 server (moto) started for the session."""
    if os.environ.get("NODUS_TEST_STORAGE", "local") != "s3":
        yield {}
        return
    from tests.fakes.s3 import CREDENTIALS, local_s3

    with local_s3("nodus-it") as endpoint:
        os.environ.update(CREDENTIALS)  # this process reads the bucket too (`Server.store`)
        yield {
            **CREDENTIALS,
            "NODUS_STORAGE": f"s3://nodus-it/storage?endpoint_override={endpoint}&scheme=http&region=us-east-1",
        }


@pytest.fixture(scope="session")
def server(
    request: pytest.FixtureRequest, fake_anthropic: Any, storage_service: dict[str, str], otlp_receiver: Any
) -> Iterator[Server]:
    base = _session_base()
    storage, sandboxes, home, faults = base / "storage", base / "sandboxes", base / "home", base / "faults"
    for path in (storage, sandboxes, home, faults):
        path.mkdir(mode=0o711)
    # Crash points only where the fault suite runs: everywhere else the service runs as shipped.
    with_faults = any(item.path.name in FAULT_SUITES for item in request.session.items)
    # Nothing of the developer's own service reaches the session's (their NODUS_* settings, a
    # RAY_ADDRESS, a key): the session configures every variable it depends on.
    inherited = {
        key: value
        for key, value in os.environ.items()
        if not (key.startswith(("NODUS_", "ANTHROPIC_", "OTEL_")) and not key.startswith("NODUS_TEST_"))
        and key not in ("RAY_ADDRESS", "RAY_TMPDIR")
    }
    env = {
        **inherited,
        "HOME": str(home),
        "NODUS_RAY_TEMP_DIR": str(base / "ray"),
        "NODUS_RAY_PORTS": str(RAY_PORTS),
        "NODUS_STORAGE": str(storage),
        "NODUS_SANDBOX_ROOT": str(sandboxes),
        "NODUS_OFFLINE_LATENCY": "0.3",
        "NODUS_INITIAL_CREDITS": "1.00",
        "ANTHROPIC_BASE_URL": fake_anthropic.base_url,
        "NODUS_API_URL": f"http://127.0.0.1:{PORT}",
        "NODUS_PROJECT": "default",
        "RAY_USAGE_STATS_ENABLED": "0",
        # The egress tests serve "the internet" on 127.0.0.2; only the operator can open a private address.
        "NODUS_EGRESS_PRIVATE_NETWORKS": "127.0.0.2/32",
        # test_webhooks' receiver listens on 127.0.0.3, the one private address webhooks may reach;
        # its retries come within seconds (the shipped schedule's first is 5s, its last 6h).
        "NODUS_WEBHOOK_ALLOW_PRIVATE": "127.0.0.3/32",
        "NODUS_WEBHOOK_RETRY_SCHEDULE": "0.5s,1s,2s,4s,8s,16s",
        # Retention as shipped for every project but RETENTION_PROJECT, whose runs lose their
        # workspace and payloads seconds after they end (test_retention): no other test's run does.
        "NODUS_PAYLOAD_RETENTION": f"30d,{RETENTION_PROJECT}=4s",
        "NODUS_WORKSPACE_RETENTION": f"24h,{RETENTION_PROJECT}=2s",
        # The images test_images builds (its `images` fixture) are the only local ones the
        # server may read.
        "NODUS_IMAGE_PATHS": str(base / "test-images"),
        # One (fake) key's haiku calls go through the rate limiter (test_rate_limits); no other's.
        "NODUS_RATE_LIMITS": session_rate_limits(),
        # Every run of the session exports its trace here (`nodus_ray.tracing`); test_traces reads it.
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.endpoint,
        **storage_service,
    }
    if with_faults:
        env["NODUS_FAULTS"] = str(faults)
        # A node that stops answering (SIGSTOP: a partition, a frozen VM) is declared dead in
        # seconds rather than Ray's default minute, so the zombie test's replacement starts soon.
        env |= {
            "RAY_health_check_period_ms": "1000",
            "RAY_health_check_timeout_ms": "2000",
            "RAY_health_check_failure_threshold": "4",
        }
    up = subprocess.run(
        [NODUS, "up", "--port", str(PORT)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    if up.returncode != 0:
        pytest.fail(f"nodus up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
    stored = json.loads((home / ".nodus" / "credentials.json").read_text())
    token = stored["servers"][f"http://127.0.0.1:{PORT}"]["token"]
    cluster = json.loads((home / ".nodus" / "cluster.json").read_text())
    # `--address auto` and the `ray` CLI of a test mean this session's Ray, as for a user whose
    # shell points RAY_ADDRESS at their cluster.
    env["RAY_ADDRESS"] = cluster["ray_address"]
    # This process too (Ray's state API, `ray.util.state.list_actors`, finds its cluster through
    # RAY_ADDRESS, else through /tmp/ray: a user's cluster, or none).
    previous_address = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = cluster["ray_address"]
    try:
        yield Server(
            api_url=f"http://127.0.0.1:{PORT}",
            storage=storage,
            sandbox_root=sandboxes,
            env=env,
            faults=faults,
            storage_uri=env["NODUS_STORAGE"],
            token=token,
            home=home,
        )
    finally:
        subprocess.run([NODUS, "down"], env=env, capture_output=True, text=True, timeout=180, check=False)
        shutil.rmtree(base, ignore_errors=True)
        if previous_address is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = previous_address


@pytest.fixture
def sdk_env(server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    """The SDK in this process, configured the documented way (environment variables)."""
    monkeypatch.setenv("NODUS_API_URL", server.api_url)
    monkeypatch.setenv("NODUS_PROJECT", "default")
    monkeypatch.setenv("NODUS_TOKEN", server.token)
    return server


@pytest.fixture(scope="session")
def ray_driver(server: Server) -> Iterator[Any]:
    """A Ray driver connected to the session's cluster, for tests that break actors on purpose."""
    import ray

    ray.init(address=server.ray_address, namespace="nodus", logging_level="ERROR", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
