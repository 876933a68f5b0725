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
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from nodus import credentials
from nodus.errors import NodusError, Unavailable
from nodus_ray.local_head import settle_ray_auth_mode, start_head, stop_head
from nodus_ray.settings import CONTROL_PLANE_NAME, NAMESPACE, SERVE_APP_NAME, HeadSettings, ServerSettings
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


def _init(address: str) -> Any:
    settle_ray_auth_mode()
    return ray.init(address=address, namespace=NAMESPACE, logging_level=logging.ERROR, log_to_driver=False)


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


def _answers(address: str) -> bool:
    """Whether a GCS listens at ``host:port`` (a dead recorded head is not waited for)."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=2).close()
    except (OSError, ValueError):
        return False
    return True


def _head_temp_dir(head: HeadSettings) -> Path:
    """Where the head `nodus up` starts keeps its sessions (Ray's default unless set)."""
    return Path(head.temp_dir or os.path.join(os.environ.get("RAY_TMPDIR") or "/tmp", "ray"))


def _started_head_address(head: HeadSettings) -> str:
    """The GCS address of the head just started: Ray writes it into the head's temp dir."""
    try:
        return (_head_temp_dir(head) / "ray_current_cluster").read_text().strip()
    except OSError:
        return f"127.0.0.1:{head.port_base or 6379}"


def _connect(address: str | None, head: HeadSettings) -> tuple[bool, Any]:
    """Connect this driver to this service's Ray; start a local head first when there is none.

    Without ``address`` only the head a previous ``nodus up`` of this user recorded is reused,
    never whatever Ray happens to run on the machine ("auto"): that may be another service's
    (a user's own next to a test session's), and joining it would reconfigure or stop it.
    Returns whether a head was started, and Ray's context (dashboard URL, session directory).
    """
    if address:
        return False, _join(address)
    recorded = _read_state().get("ray_address")
    if isinstance(recorded, str) and recorded and _answers(recorded):
        try:
            return False, _init(recorded)
        except ConnectionError:
            pass
    settle_ray_auth_mode()  # before the head starts: it and this driver must agree
    start_head(head)
    try:
        return True, _init(_started_head_address(head))
    except BaseException:
        # A head this call started and cannot join is stopped again, not left running with no
        # state file to say so (`up` does the same for a head that does not serve).
        _stop_started_head(head)
        raise


def _stop_started_head(head: HeadSettings) -> None:
    session = _head_temp_dir(head) / "session_latest"
    if session.exists():
        stop_head(str(session.resolve()), _started_head_address(head), force=True)


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

    router: Any = (
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


def _deploy_api(port: int, port_base: int | None) -> None:
    from ray import serve

    from nodus_serve.deployment import build
    from nodus_serve.ingress import controller_env

    # Serve narrates every step at INFO on the driver; `nodus up` prints its own summary.
    logging.getLogger("ray.serve").setLevel(logging.WARNING)

    # HAProxy straight to the replicas where it can (`nodus_serve.ingress`, decision 52): the
    # controller's environment, fixed when it starts (a running controller keeps its own).
    env = controller_env(port_base)
    serve.start(
        http_options={"host": "127.0.0.1", "port": port},
        controller_options={"runtime_env": {"env_vars": env}} if env else None,
    )
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
        head = HeadSettings.from_env()
    except ValueError as error:
        raise NodusError(str(error), code="Invalid") from None
    if storage:
        settings = replace(settings, storage_uri=storage)
    try:
        install_configured_key(settings.secret_key_file)
    except ValueError as error:
        raise NodusError(str(error), code="Invalid") from None
    started, ray_context = _connect(address, head)
    session_dir = str(ray_context.address_info.get("session_dir") or "")
    gcs_address = ray.get_runtime_context().gcs_address
    try:
        control_plane, info = _ensure_control_plane(settings)
        backend = _configure_model_key(control_plane)
        _ensure_router()
        _deploy_api(port, head.port_base)
        api_url = f"http://127.0.0.1:{port}"
        token_file = _keep_operator_token(control_plane, api_url)
        _wait_ready(api_url)
        dashboard = getattr(ray_context, "dashboard_url", None)
        result = UpInfo(
            api_url=api_url,
            storage=settings.storage_uri,
            model_backend=backend,
            sandbox=str(info["sandbox"]),
            ray_address=gcs_address,
            dashboard_url=f"http://{dashboard}" if dashboard else None,
            started_ray=started,
            credentials_file=token_file,
        )
    except BaseException:
        # A head this call started and that does not serve is stopped again: left running, with
        # no state file to say `nodus up` started it, the next `nodus up` would not know it and
        # `nodus down` would leave it running.
        ray.shutdown()
        if started and session_dir:
            stop_head(session_dir, gcs_address, force=True)
        raise
    finally:
        ray.shutdown()
    _record_state(result, session_dir)
    return result


def _record_state(result: UpInfo, session_dir: str) -> None:
    """What ``down`` and the next ``up`` need: the cluster's address, and whether (and which
    session of) a head this user's ``up`` started, so that only that head is ever stopped."""
    previous = _read_state()
    state: dict[str, object] = {**asdict(result), "session_dir": session_dir if result.started_ray else ""}
    if not result.started_ray and previous.get("ray_address") == result.ray_address:
        # Reattached to the head an earlier `up` started: it is still ours to stop.
        state["started_ray"] = bool(previous.get("started_ray"))
        state["session_dir"] = previous.get("session_dir") or ""
    _STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    _STATE_FILE.write_text(json.dumps(state, indent=2))


def _read_state() -> dict[str, object]:
    try:
        loaded = json.loads(_STATE_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def down() -> str:
    """Stop this user's service. A Ray head that `up` started is stopped (that head alone, never
    another Ray on the machine); from a joined cluster only the API and nodus actors go."""
    state = _read_state()
    address = state.get("ray_address")
    if not isinstance(address, str) or not address:
        return "no nodus service was started here (no ~/.nodus/cluster.json); nothing to stop"
    session_dir = state.get("session_dir")
    if state.get("started_ray") and isinstance(session_dir, str) and session_dir:
        stopped = stop_head(session_dir, address)
        _STATE_FILE.unlink(missing_ok=True)
        if not stopped:
            return "the local Ray cluster had already stopped; storage is kept"
        return (
            "stopped the local Ray cluster (the API, the control plane and every run actor); storage is kept"
        )
    if not _answers(address):
        _STATE_FILE.unlink(missing_ok=True)
        return "no Ray cluster is running; nothing to stop"
    try:
        _init(address)
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
