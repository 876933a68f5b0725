"""The environment that puts HAProxy in front of the API's replicas (`nodus_serve.ingress`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nodus_ray.local_head import HeadPorts
from nodus_serve import ingress


@pytest.fixture
def with_haproxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODUS_SERVE_INGRESS", raising=False)
    monkeypatch.setattr(ingress, "haproxy_ingress", lambda: True)


def test_a_service_with_a_port_block_keeps_every_serve_port_inside_it(with_haproxy: None) -> None:
    block = HeadPorts(23000)
    env = ingress.controller_env(block.base)
    ports = [
        int(env[name])
        for name in (
            "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
            "RAY_SERVE_HAPROXY_STATS_PORT",
            "RAY_SERVE_HAPROXY_METRICS_PORT",
        )
    ]
    replicas = range(
        int(env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"]),
        int(env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) + 1,  # Serve includes both ends
    )
    taken = [*ports, *replicas]
    # base+20 is the API's, base+21 the API benchmark's uvicorn; Ray's workers start at +100.
    assert all(block.api + 2 <= port < block.base + 100 for port in taken)
    assert len(set(taken)) == len(taken)
    # Each redeploy holds a port for Serve's quarantine (and one still bound is blocked for
    # good): the range must outlast many quick redeploys, not just one roll-over.
    assert len(replicas) >= 50
    assert "RAY_SERVE_PORT_QUARANTINE_S" not in env
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"


def test_a_default_service_keeps_serves_default_ports(with_haproxy: None) -> None:
    env = ingress.controller_env(None)
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert not any(name.endswith("_PORT") for name in env)


def test_the_replicas_get_the_same_switch_as_the_controller(with_haproxy: None) -> None:
    replica = ingress.replica_env()
    controller = ingress.controller_env(None)
    assert all(controller[name] == value for name, value in replica.items())


def test_the_python_proxy_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODUS_SERVE_INGRESS", "proxy")
    assert not ingress.haproxy_ingress()
    assert ingress.replica_env() == {} and ingress.controller_env(23000) == {}


def test_the_cluster_config_sets_what_nodus_up_sets(with_haproxy: None) -> None:
    """`serve deploy serve/config.yaml` (a cluster) runs the ingress `nodus up` runs."""
    config = yaml.safe_load((Path(__file__).parents[2] / "serve" / "config.yaml").read_text())
    deployed = config["controller_options"]["runtime_env"]["env_vars"]
    expected = {k: v for k, v in ingress.controller_env(None).items() if k != "RAY_SERVE_HAPROXY_NBTHREAD"}
    assert deployed == expected
