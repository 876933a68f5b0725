"""What the Ray dashboard shows: every actor of ours named and saying what it is, and our metrics
in Ray's Prometheus export (the Metrics view and the Grafana dashboard read these)."""

from __future__ import annotations

import re
from typing import Any

import httpx

from .conftest import Server, unique, wait_for
from .kit import RUNS, V1, agent, batch, finished, group, member, seal


def _exported(ray: Any) -> str:
    """Every node's Prometheus export, as the Metrics view's Prometheus would scrape it."""
    texts = []
    for node in ray.nodes():
        if node.get("Alive") and node.get("MetricsExportPort"):
            try:
                texts.append(
                    httpx.get(
                        f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics", timeout=10
                    ).text
                )
            except httpx.HTTPError:
                continue
    return "\n".join(texts)


def _series(text: str, name: str, **labels: str) -> float | None:
    """The sum of the samples of ``name`` whose labels include ``labels``; None when there is none."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        body, _, value = line.rpartition("} ")
        if all(f'{key}="{wanted}"' in body for key, wanted in labels.items()):
            total += float(value)
            found = True
    return total if found else None


def test_our_metrics_reach_rays_prometheus_export(server: Server, ray_driver: Any) -> None:
    agent_name, group_name = unique("metered"), unique("gm")
    agent(server, agent_name)
    group(server, group_name, agent_name, limits={"maxActive": 2})
    assert (
        batch(
            server,
            [
                member(group_name, agent_name, f"t{i}", "Use the shell to run `echo metered`")
                for i in range(3)
            ],
        ).status_code
        == 201
    )
    seal(server, group_name)
    finished(server, group_name)

    wanted = {
        "ray_nodus_model_calls_total": {"model": "offline-haiku", "family": "haiku", "access": "Nodus"},
        "ray_nodus_model_tokens_total": {"kind": "output"},
        "ray_nodus_model_call_seconds_count": {"model": "offline-haiku"},
        "ray_nodus_command_seconds_count": {"outcome": "ok"},
        "ray_nodus_journal_write_seconds_count": {},
        "ray_nodus_admission_decisions_total": {"group": group_name, "decision": "start"},
        "ray_nodus_runs": {"project": "default", "phase": "Succeeded"},
        "ray_nodus_group_runs": {"group": group_name, "state": "queued"},
    }

    def all_there() -> str | None:
        text = _exported(ray_driver)
        return (
            text
            if all(_series(text, name, **labels) is not None for name, labels in wanted.items())
            else None
        )

    text = wait_for(all_there, timeout=90, interval=2, message="our metrics in Ray's export")
    assert _series(text, "ray_nodus_admission_decisions_total", group=group_name, decision="start") == 3
    assert _series(text, "ray_nodus_model_calls_total", model="offline-haiku") >= 6  # two calls per run
    assert _series(text, "ray_nodus_group_runs", group=group_name, state="active") == 0, (
        "a finished group shows 0"
    )
    # No label names a run: the series stay bounded however many runs there are.
    assert not re.search(r'(run|name)="' + re.escape(group_name) + r"-t\d", text)


def test_every_actor_of_ours_is_named_and_says_what_it_is(server: Server, ray_driver: Any) -> None:
    from ray.util.state import list_actors

    agent_name, run_name = unique("shown"), unique("shown-run")
    agent(server, agent_name)
    with server.http() as http:
        assert (
            http.post(
                RUNS,
                json={
                    "apiVersion": V1,
                    "kind": "AgentRun",
                    "metadata": {"name": run_name},
                    "spec": {"agent": agent_name, "input": "Use the shell to run `sleep 5`"},
                },
            ).status_code
            == 201
        )
        wait_for(
            lambda: http.get(f"{RUNS}/{run_name}").json()["status"]["phase"] == "Running",
            timeout=60,
            message="the run to be running",
        )
    alive = [
        a
        for a in list_actors(filters=[("state", "=", "ALIVE")], limit=10000, detail=True)
        if a.ray_namespace == "nodus"
    ]
    shown = {a.name: a.repr_name for a in alive}
    assert shown["nodus-control-plane"].startswith("ControlPlane(storage=")
    assert shown["nodus-router"]
    runs = [
        repr_name
        for name, repr_name in shown.items()
        if name.startswith(("run.", "runslot.")) and f"run=default/{run_name}," in (repr_name or "")
    ]
    # Ray takes the repr when the actor's __init__ returns: it names the run, its agent and revision.
    assert len(runs) == 1 and runs[0].startswith(f"RunActor(run=default/{run_name}, agent={agent_name}@1,")
    assert all(name for name in shown), "every actor of ours has a name"
