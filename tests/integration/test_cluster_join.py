"""`nodus up --address`: join a cluster that exists instead of starting one, and say so clearly
when there is none."""

from __future__ import annotations

import subprocess
from typing import Any

import psutil

from .conftest import NODUS, PORT, Server


def _gcs_servers(under: str = "") -> int:
    """GCS servers on the machine (one per Ray cluster), or those whose logs are under ``under``."""
    return sum(
        1
        for process in psutil.process_iter(["name", "cmdline"])
        if process.info["name"] == "gcs_server" and under in " ".join(process.info["cmdline"] or [])
    )


def test_up_with_address_auto_joins_the_running_cluster(server: Server, ray_driver: Any) -> None:
    before = _gcs_servers()
    ours = server.env["NODUS_RAY_TEMP_DIR"]
    address = ray_driver.get_runtime_context().gcs_address
    joined = subprocess.run(
        [NODUS, "up", "--address", "auto", "--port", str(PORT)],
        env=server.env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert joined.returncode == 0, joined.stderr
    assert f"Ray       {address}" in joined.stdout
    assert _gcs_servers() == before, "no second cluster was started"
    assert _gcs_servers(ours) == 1, "the session's own cluster is the one joined"
    with server.http() as http:
        assert http.get("/readyz").json()["status"] == "ready"


def test_up_with_an_address_where_no_cluster_is_fails_at_once_in_one_line(server: Server) -> None:
    refused = subprocess.run(
        [NODUS, "up", "--address", "127.0.0.1:1", "--port", "18999"],
        env=server.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 1
    # Refused at once, not after Ray's own long wait: this message comes only from the probe of
    # the port that `nodus up` makes before it hands the address to Ray.
    assert refused.stderr.startswith("error: Unavailable: no Ray cluster answers at 127.0.0.1:1;")
    assert refused.stderr.count("\n") == 1
