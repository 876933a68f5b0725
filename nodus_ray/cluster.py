"""``nodus up`` and ``nodus down``: bring the service onto a Ray cluster and take it off.

``up`` starts a local Ray head (or joins the cluster at ``address``), creates the control
plane actor, which reloads everything from storage and resumes unfinished runs, and deploys
the Serve app. It is idempotent: on a running service it reattaches and reports. The driver
exits afterwards; the detached actors and the Serve app keep running.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from nodus import credentials
from nodus.errors import NodusError, Unavailable
from nodus_ray.settings import CONTROL_PLANE_NAME, NAMESPACE, SERVE_APP_NAME, ServerSettings
from nodus_ray.store.secret_box import install_configured_key

__all__ = ["UpInfo", "up", "down"]

_STATE_FILE = Path.home() / ".nodus" / "cluster.json"
_READY_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class UpInfo:
    api_url: str
    storage: str
    model_backend: str
    sandbox: str
    ray_address: str
    dashboard_url: str | None
    started_ray: bool
    credentials_file: str | None = None  # where the local user's operator token is kept


def _ray_executable() -> str:
    candidate = Path(sys.executable).parent / "ray"
    return str(candidate) if candidate.exists() else "ray"


def _start_local_head() -> None:
    command = [
        _ray_executable(),
        "start",
        "--head",
        "--disable-usage-stats",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
    ]
    # Ray's workers inherit this environment; the server's key reaches the control plane over
    # RPC instead, so it is kept out of every worker process.
    environment = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "NODUS_SECRET_KEY")}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise Unavailable(f"`ray start --head` failed: {tail[0]}")


def _init(address: str) -> Any:
    return ray.init(address=address, namespace=NAMESPACE, logging_level="ERROR", log_to_driver=False)


def _join(address: str) -> Any:
    """Connect to an existing cluster, never start one; a clear error when there is none.

    A ``host:port`` that nothing listens on is refused at once: Ray itself would wait minutes
    for a GCS that is not there.
    """
    if address not in ("auto", "local") and "://" not in address:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
        except (OSError, ValueError):
            raise Unavailable(
                f"no Ray cluster answers at {address}; start one with `ray start --head`, "
                "or run `nodus up` without --address to start a local one"
            ) from None
    try:
        return _init(address)
    except ConnectionError as exc:
        first = (str(exc).strip().splitlines() or ["no cluster"])[0]
        raise Unavailable(
            f"no Ray cluster to join at {address!r} ({first}); start one with `ray start --head`, "
            "or run `nodus up` without --address to start a local one"
        ) from None


def _connect(address: str | None) -> tuple[bool, Any]:
    """Connect this driver; start a local head first when there is no cluster.

    Returns whether a head was started, and Ray's context (which knows the dashboard URL).
    """
    if address:
        return False, _join(address)
    try:
        return False, _init("auto")
    except ConnectionError:
        _start_local_head()
        return True, _init("auto")


def _ensure_control_plane(settings: ServerSettings) -> tuple[Any, dict[str, object]]:
    from nodus_ray.control.plane import RemoteControlPlane

    # Pinned to the node `nodus up` runs on: the key that seals Secrets is a file there.
    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    actor = RemoteControlPlane.options(
        name=CONTROL_PLANE_NAME,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=here,
    ).remote(settings)
    info = ray.get(actor.ready.remote())
    if info.get("settingsDigest") != settings.digest():
        running = ray.get(actor.running_settings.remote())
        wanted = settings.describe()
        changed = ", ".join(
            f"{key} is {running.get(key)!r} (asked {wanted[key]!r})"
            for key in wanted
            if running.get(key) != wanted[key]
        )
        raise NodusError(
            f"nodus is already running with other settings: {changed or 'they differ'}; "
            "run `nodus down` first to change them",
            code="Conflict",
        )
    return actor, info


def _ensure_router() -> None:
    """The routing service every run asks before a turn; runs fall back to sonnet without it."""
    from nodus_ray.runtime.router import ROUTER_ACTOR_NAME, JevRouter

    router = (
        ray.remote(num_cpus=0, max_restarts=-1)(JevRouter)
        .options(name=ROUTER_ACTOR_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True)
        .remote()
    )
    ray.get(router.route.remote("ping", ["haiku", "sonnet"]))


def _configure_model_key(control_plane: Any) -> str:
    """Hand the server's Anthropic key (if any) to the control plane, which seals it in storage.

    The key goes over Ray's RPC, not into actor options or the environment of workers, so it
    appears in no dashboard and no log.
    """
    return str(ray.get(control_plane.configure_model_key.remote(os.environ.get("ANTHROPIC_API_KEY") or None)))


def _keep_operator_token(control_plane: Any, api_url: str) -> str:
    """The local user's operator token, in the credentials file the CLI and SDK read (0600).

    The token travels over Ray's RPC and lands only in that file; storage keeps its hash.
    """
    stored = credentials.lookup(api_url)
    token = ray.get(control_plane.ensure_operator_token.remote(stored["token"] if stored else None))
    if stored is None or stored["token"] != token:
        credentials.remember(api_url, token)
    return str(credentials.credentials_file())


def _deploy_api(port: int) -> None:
    from ray import serve

    from nodus_serve.deployment import build

    # Serve narrates every step at INFO on the driver; `nodus up` prints its own summary.
    logging.getLogger("ray.serve").setLevel(logging.WARNING)

    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build(), name=SERVE_APP_NAME, route_prefix="/", blocking=False)


def _wait_ready(api_url: str) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT_SECONDS
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{api_url}/readyz", timeout=5.0)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.25)
    raise Unavailable(f"the API at {api_url} did not become ready in {_READY_TIMEOUT_SECONDS:.0f}s ({last})")


def up(address: str | None = None, port: int = 8000, storage: str | None = None) -> UpInfo:
    """Start or reuse Ray, the control plane and the API; return where everything is."""
    try:
        settings = ServerSettings.from_env()
    except ValueError as error:
        raise NodusError(str(error), code="Invalid") from None
    if storage:
        settings = replace(settings, storage_uri=storage)
    try:
        install_configured_key(settings.secret_key_file)
    except ValueError as error:
        raise NodusError(str(error), code="Invalid") from None
    started, ray_context = _connect(address)
    try:
        control_plane, info = _ensure_control_plane(settings)
        backend = _configure_model_key(control_plane)
        _ensure_router()
        _deploy_api(port)
        api_url = f"http://127.0.0.1:{port}"
        token_file = _keep_operator_token(control_plane, api_url)
        _wait_ready(api_url)
        context = ray.get_runtime_context()
        dashboard = getattr(ray_context, "dashboard_url", None)
        result = UpInfo(
            api_url=api_url,
            storage=settings.storage_uri,
            model_backend=backend,
            sandbox=str(info["sandbox"]),
            ray_address=context.gcs_address,
            dashboard_url=f"http://{dashboard}" if dashboard else None,
            started_ray=started,
            credentials_file=token_file,
        )
    except BaseException:
        # A head this call started and that does not serve is stopped again: left running, with
        # no state file to say `nodus up` started it, the next `nodus up` would join it (and its
        # workers would keep this call's environment) and `nodus down` would leave it running.
        ray.shutdown()
        if started:
            subprocess.run(
                [_ray_executable(), "stop", "--force"], capture_output=True, text=True, check=False
            )
        raise
    finally:
        ray.shutdown()
    previous = _read_state()
    _STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    state = asdict(result)
    state["started_ray"] = started or bool(previous.get("started_ray"))
    _STATE_FILE.write_text(json.dumps(state, indent=2))
    return result


def _read_state() -> dict[str, object]:
    try:
        return json.loads(_STATE_FILE.read_text())
    except (OSError, ValueError):
        return {}


def down() -> str:
    """Stop the service. A Ray head that `up` started is stopped; a joined cluster is left running."""
    state = _read_state()
    if state.get("started_ray"):
        subprocess.run([_ray_executable(), "stop"], capture_output=True, text=True, check=False)
        _STATE_FILE.unlink(missing_ok=True)
        return (
            "stopped the local Ray cluster (the API, the control plane and every run actor); storage is kept"
        )
    try:
        ray.init(
            address=str(state.get("ray_address") or "auto"),
            namespace=NAMESPACE,
            logging_level="ERROR",
            log_to_driver=False,
        )
    except ConnectionError:
        _STATE_FILE.unlink(missing_ok=True)
        return "no Ray cluster is running; nothing to stop"
    try:
        from ray import serve

        serve.delete(SERVE_APP_NAME)
        stopped = 0
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry.get("namespace") == NAMESPACE:
                ray.kill(ray.get_actor(entry["name"], namespace=NAMESPACE), no_restart=True)
                stopped += 1
    finally:
        ray.shutdown()
    _STATE_FILE.unlink(missing_ok=True)
    return f"removed the API and {stopped} nodus actors from the cluster; the cluster and storage are kept"
