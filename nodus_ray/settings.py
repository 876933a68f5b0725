"""Server settings, read once from the environment of ``nodus up``.

Only non-secret values live here; they are handed to actors explicitly so an actor never
depends on which process happened to start its worker.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

from nodus.egress_policy import PRIVATE_NETWORKS_ENV, parse_private_networks
from nodus_ray.money.prices import PriceTable
from nodus_ray.store.storage import default_storage_uri, redact_uri
from nodus_ray.tracing.attributes import redacted_telemetry, telemetry_from_env

__all__ = ["NAMESPACE", "CONTROL_PLANE_NAME", "SERVE_APP_NAME", "HeadSettings", "ServerSettings"]

NAMESPACE = "nodus"
CONTROL_PLANE_NAME = "nodus-control-plane"
SERVE_APP_NAME = "nodus"


def _default_sandbox_root() -> str:
    # Sandboxed commands run as an unprivileged uid, which cannot traverse root's home (mode
    # 700): as root, workspaces live in /var/lib; otherwise in the user's own home.
    if os.geteuid() == 0:
        return "/var/lib/nodus/sandboxes"
    return str(Path.home() / ".nodus" / "sandboxes")


@dataclass(frozen=True)
class HeadSettings:
    """Where the Ray head that ``nodus up`` starts lives: its own temp dir and ports.

    Unset, Ray's defaults (``/tmp/ray``, GCS 6379, dashboard 8265). A second service on the
    same machine (a test session, a benchmark) sets both, so the two never meet.
    """

    temp_dir: str | None = None  # NODUS_RAY_TEMP_DIR
    port_base: int | None = None  # NODUS_RAY_PORTS: the GCS port; the head's other ports follow it

    @classmethod
    def from_env(cls) -> HeadSettings:
        raw = os.environ.get("NODUS_RAY_PORTS", "").strip()
        base: int | None = None
        if raw:
            try:
                base = int(raw)
            except ValueError:
                base = -1
            if not 1024 <= base <= 64000:
                raise ValueError(
                    f"NODUS_RAY_PORTS must be a port between 1024 and 64000 (the head's ports are it "
                    f"and the 999 after it), not {raw!r}"
                )
        temp_dir = os.environ.get("NODUS_RAY_TEMP_DIR", "").strip() or None
        if temp_dir is not None and not os.path.isabs(temp_dir):
            raise ValueError(f"NODUS_RAY_TEMP_DIR must be an absolute path, not {temp_dir!r}")
        return cls(temp_dir=temp_dir, port_base=base)


@dataclass(frozen=True)
class ServerSettings:
    storage_uri: str
    sandbox_root: str
    offline_latency_seconds: float = 0.0
    max_actor_restarts: int = 5
    # Where the key that seals Secrets lives: beside the server, never in storage.
    secret_key_file: str = str(Path.home() / ".nodus" / "secret.key")
    # ANTHROPIC_BASE_URL of `nodus up`; None is the SDK's default endpoint.
    anthropic_base_url: str | None = None
    # The operator's price overrides (NODUS_PRICES): a JSON or YAML file.
    prices_file: str | None = None
    # What a project's credit balance starts at (NODUS_INITIAL_CREDITS).
    initial_credits_usd: str = "5.00"
    # Pre-started run actors kept waiting per node (NODUS_RUN_POOL; 0 turns the pool off).
    run_pool_per_node: int = 2
    # Whether runs snapshot their workspace to storage after every command
    # (NODUS_WORKSPACE_SNAPSHOTS=on|off), so a run that moves to another node keeps its files.
    workspace_snapshots: bool = True
    # Private networks the operator lets runs reach through the egress proxy
    # (NODUS_EGRESS_PRIVATE_NETWORKS, comma-separated CIDRs): none by default, so an Agent's
    # allowedHosts can never name the host's own ports or a cloud metadata address.
    egress_private_networks: str = ""
    # The CPU seconds a durable Python program may use per actor (NODUS_PROGRAM_CPU_SECONDS):
    # a program looping without steps is stopped by this, or by its run's deadline.
    program_cpu_seconds: int = 3600
    # How long a finished run's recorded payloads (NODUS_PAYLOAD_RETENTION) and its workspace
    # (NODUS_WORKSPACE_RETENTION) are kept after it ends: a duration ("30d", "24h", "2s"), then
    # optional per-project overrides ("30d,audit=365d"); `control.retention` reads them.
    payload_retention: str = "30d"
    workspace_retention: str = "24h"
    # Directories local image references (oci:PATH, oci-archive:FILE) may point into
    # (NODUS_IMAGE_PATHS, ':'-separated absolute paths; ~/.nodus/images of the user who runs the
    # service by default), so no token can make the server read any other path of its disk as
    # an image; registry images (docker://) need none.
    image_paths: str = ""
    # The OTEL_* variables of `nodus up` when OTEL_EXPORTER_OTLP_ENDPOINT is set, handed to run
    # actors, which then export traces over OTLP/HTTP (`nodus_ray.tracing`); () is off.
    telemetry: tuple[tuple[str, str], ...] = ()
    # The operator's rate limits per Anthropic key fingerprint and model family
    # (NODUS_RATE_LIMITS, `core.rate_limits`), checked here and handed to every run actor.
    rate_limits: str = ""
    # Webhooks (`nodus_ray.webhooks`): private addresses the operator lets them reach
    # (NODUS_WEBHOOK_ALLOW_PRIVATE: 1 or CIDRs), and their retry delays (NODUS_WEBHOOK_RETRY_SCHEDULE).
    webhook_allow_private: str = ""
    webhook_retry_schedule: str = ""

    @classmethod
    def from_env(cls) -> ServerSettings:
        """Read and check the environment; a bad value is refused here, not in every run."""
        raw_latency = os.environ.get("NODUS_OFFLINE_LATENCY", "0") or "0"
        try:
            latency = float(raw_latency)
        except ValueError:
            raise ValueError(f"NODUS_OFFLINE_LATENCY={raw_latency!r} is not a number of seconds") from None
        if not 0 <= latency <= 600:
            raise ValueError(f"NODUS_OFFLINE_LATENCY={raw_latency!r} must be between 0 and 600 seconds")
        sandbox_root = os.environ.get("NODUS_SANDBOX_ROOT") or _default_sandbox_root()
        if not os.path.isabs(sandbox_root):
            raise ValueError(f"NODUS_SANDBOX_ROOT={sandbox_root!r} must be an absolute path")
        initial_credits = os.environ.get("NODUS_INITIAL_CREDITS", "5.00")
        try:
            if Decimal(initial_credits) < 0:
                raise InvalidOperation
        except InvalidOperation:
            raise ValueError(
                f"NODUS_INITIAL_CREDITS={initial_credits!r} must be a decimal amount of dollars"
            ) from None
        raw_pool = os.environ.get("NODUS_RUN_POOL", "2") or "2"
        if not raw_pool.isdigit() or int(raw_pool) > 64:
            raise ValueError(f"NODUS_RUN_POOL={raw_pool!r} must be a whole number from 0 to 64")
        raw_snapshots = (os.environ.get("NODUS_WORKSPACE_SNAPSHOTS") or "on").lower()
        if raw_snapshots not in ("on", "off"):
            raise ValueError(f"NODUS_WORKSPACE_SNAPSHOTS={raw_snapshots!r} must be 'on' or 'off'")
        private_networks = os.environ.get(PRIVATE_NETWORKS_ENV, "").strip()
        parse_private_networks(private_networks)  # a bad CIDR is refused here, naming it
        raw_cpu = os.environ.get("NODUS_PROGRAM_CPU_SECONDS", "3600") or "3600"
        if not raw_cpu.isdigit() or not 1 <= int(raw_cpu) <= 10**7:
            raise ValueError(f"NODUS_PROGRAM_CPU_SECONDS={raw_cpu!r} must be a whole number of seconds")
        from nodus_ray.control.retention_policy import RetentionPolicy  # checked here, once

        payload_retention = os.environ.get("NODUS_PAYLOAD_RETENTION", "").strip() or "30d"
        workspace_retention = os.environ.get("NODUS_WORKSPACE_RETENTION", "").strip() or "24h"
        RetentionPolicy.parse(payload_retention, "NODUS_PAYLOAD_RETENTION")
        RetentionPolicy.parse(workspace_retention, "NODUS_WORKSPACE_RETENTION")
        from nodus_ray.control.run_images import IMAGE_PATHS_ENV, LocalImages

        # By default the operator's own image folder, ~/.nodus/images, beside the secret key.
        image_paths = os.environ.get(IMAGE_PATHS_ENV, "").strip() or str(Path.home() / ".nodus" / "images")
        LocalImages.parse(image_paths)  # a relative directory is refused here, naming it
        from nodus_ray.core.rate_limits import RATE_LIMITS_ENV, RateLimitTable

        # a limit that is not a positive number is refused here, naming the entry and field
        rate_limits = RateLimitTable.parse(os.environ.get(RATE_LIMITS_ENV)).to_text()
        from nodus_ray.webhooks.addresses import ALLOW_PRIVATE_ENV, PrivateAccess
        from nodus_ray.webhooks.retry import RETRY_SCHEDULE_ENV, RetrySchedule

        webhook_private = os.environ.get(ALLOW_PRIVATE_ENV, "").strip()
        PrivateAccess.parse(webhook_private)  # a bad CIDR is refused here, naming it
        webhook_retries = RetrySchedule.parse(os.environ.get(RETRY_SCHEDULE_ENV)).text()
        prices_file = os.environ.get("NODUS_PRICES") or None
        if prices_file is not None:
            prices_file = os.path.abspath(prices_file)
            PriceTable.load(prices_file)  # a bad override is refused here, naming the field
        return cls(
            storage_uri=os.environ.get("NODUS_STORAGE") or default_storage_uri(),
            sandbox_root=sandbox_root,
            offline_latency_seconds=latency,
            secret_key_file=os.path.abspath(
                os.path.expanduser(
                    os.environ.get("NODUS_SECRET_KEY_FILE") or str(Path.home() / ".nodus" / "secret.key")
                )
            ),
            anthropic_base_url=os.environ.get("ANTHROPIC_BASE_URL") or None,
            prices_file=prices_file,
            initial_credits_usd=initial_credits,
            run_pool_per_node=int(raw_pool),
            workspace_snapshots=raw_snapshots == "on",
            egress_private_networks=private_networks,
            program_cpu_seconds=int(raw_cpu),
            payload_retention=payload_retention,
            workspace_retention=workspace_retention,
            image_paths=image_paths,
            telemetry=telemetry_from_env(os.environ),  # a bad endpoint is refused here, naming it
            rate_limits=rate_limits,
            webhook_allow_private=webhook_private,
            webhook_retry_schedule=webhook_retries,
        )

    def digest(self) -> str:
        """Identifies these settings without showing them (the storage URI may hold credentials)."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> dict[str, object]:
        """The settings as they may be shown: credentials in the storage URI redacted."""
        return {
            **asdict(self),
            "storage_uri": redact_uri(self.storage_uri),
            "telemetry": redacted_telemetry(self.telemetry),
        }
