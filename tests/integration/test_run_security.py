"""What a run's commands get and what leaks out of them, through the real server.

A secret reaches a command as an environment variable (an Agent's ``spec.env`` entry with
``secretKeyRef``) and shows up as a redaction marker in the steps, the answer, the events and
storage. A run reaches only the hosts its Agent allows, through the egress proxy, and each
connection is recorded with its command and streamed as an event.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Server, unique, wait_for

V1 = "nodus.dev/v1"
BASE = "/v1/projects/default"


def _agent(server: Server, name: str, **spec: Any) -> None:
    with server.http() as http:
        answer = http.put(
            f"{BASE}/agents/{name}",
            json={
                "apiVersion": V1,
                "kind": "Agent",
                "metadata": {"name": name},
                "spec": {"system": "Run what you are asked.", "perRunMaxCostUSD": "0.10", **spec},
            },
        )
        assert answer.status_code == 201, answer.text


def _finished_run(server: Server, agent: str, commands: list[str]) -> dict[str, Any]:
    name = unique("sec-run")
    prompt = "run:\n" + "\n".join(commands)  # the offline model runs each line verbatim
    with server.http() as http:
        created = http.post(
            f"{BASE}/agentruns",
            json={
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": name},
                "spec": {"agent": agent, "input": prompt},
            },
        )
        assert created.status_code == 201, created.text
        return wait_for(
            lambda: (
                (r := http.get(f"{BASE}/agentruns/{name}").json())["status"]["phase"]
                in ("Succeeded", "Failed")
                and r
            ),
            timeout=120,
            message=f"run {name} to end",
        )


def _steps(server: Server, name: str) -> list[dict[str, Any]]:
    with server.http() as http:
        return http.get(f"{BASE}/agentruns/{name}/steps").json()["items"]


def _outputs(server: Server, name: str) -> list[str]:
    return [step["detail"]["result"]["output"] for step in _steps(server, name) if step["kind"] == "command"]


def _stored_text(server: Server, run: str) -> str:
    """Every file the service stored for the run (journal, status, answer, snapshots), as text."""
    store = server.store()
    texts: list[str] = []

    def walk(key: str) -> None:
        try:
            names = store.list_dir(key)
        except NotADirectoryError:  # a local file (S3 lists a file as empty)
            names = []
        if not names and store.exists(key):
            texts.append(store.read_bytes(key).decode("utf-8", "replace"))
        for name in names:
            walk(f"{key}/{name}")

    walk(f"projects/default/agentruns/{run}")
    assert len(texts) > 2, "the run's files were read"
    return "\n".join(texts)


@pytest.fixture(scope="module")
def secret_value(server: Server) -> Iterator[str]:
    value = f"s3cr3t-{unique('pw')}"
    with server.http() as http:
        assert (
            http.put(
                f"{BASE}/secrets/db-{value[-8:]}",
                json={
                    "apiVersion": V1,
                    "kind": "Secret",
                    "metadata": {"name": f"db-{value[-8:]}"},
                    "stringData": {"PASSWORD": value},
                },
            ).status_code
            == 201
        )
    yield value


def test_a_secret_reaches_the_command_and_only_a_marker_reaches_anything_recorded(
    server: Server,
    secret_value: str,
) -> None:
    secret = f"db-{secret_value[-8:]}"
    agent = unique("sec-agent")
    _agent(
        server,
        agent,
        env=[
            {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": secret, "key": "PASSWORD"}}},
            {"name": "MODE", "value": "fast"},
        ],
    )
    run = _finished_run(
        server,
        agent,
        [
            'echo "pw=$DB_PASSWORD mode=$MODE"',
            "printenv DB_PASSWORD | wc -c",
            "tr '\\0' ' ' < /proc/1/cmdline",
        ],
    )
    assert run["status"]["phase"] == "Succeeded", run["status"]
    echoed, length, bwrap_line = _outputs(server, run["metadata"]["name"])
    marker = f"[REDACTED:{secret}/PASSWORD]"
    assert f"pw={marker} mode=fast" in echoed
    assert length.strip().endswith(str(len(secret_value) + 1))  # the real value was there, newline included
    assert "bwrap" in bwrap_line and "REDACTED" not in bwrap_line  # not on the sandbox's command line
    with server.http() as http:
        answer = http.get(f"{BASE}/agentruns/{run['metadata']['name']}/answer").json()["answer"]
    assert marker in answer and secret_value not in answer
    logs = server.cli("agentrun", "logs", run["metadata"]["name"])
    assert logs.returncode == 0 and secret_value not in logs.stdout
    assert secret_value not in _stored_text(server, run["metadata"]["name"])
    assert secret_value not in json.dumps(run)
    needle = secret_value.encode()
    ray_logs = server.ray_logs()  # every session of this test's Ray, recursively: workers', GCS's, Serve's
    assert any("serve" in log.relative_to(server.base).parts for log in ray_logs), "Serve's logs were read"
    assert [log for log in ray_logs if needle in log.read_bytes()] == []


def _other_projects_finished_run(server: Server, marker: str) -> tuple[str, str]:
    """A run of another project that left ``marker`` in its workspace and its journal."""
    project, agent, run = unique("contain"), unique("agent"), unique("run")
    with server.http() as http:  # the operator's token reaches every project
        base = f"/v1/projects/{project}"
        answer = http.put(
            f"{base}/agents/{agent}",
            json={"apiVersion": V1, "kind": "Agent", "metadata": {"name": agent}, "spec": {"system": "x"}},
        )
        assert answer.status_code == 201, answer.text
        answer = http.post(
            f"{base}/agentruns",
            json={
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": run},
                "spec": {"agent": agent, "input": f"run:\necho {marker} > notes.txt"},
            },
        )
        assert answer.status_code == 201, answer.text
        wait_for(
            lambda: http.get(f"{base}/agentruns/{run}").json()["status"]["phase"] == "Succeeded",
            timeout=120,
            message=f"run {run} of project {project} to succeed",
        )
    return project, run


def test_a_run_on_the_server_cannot_read_other_runs_projects_keys_storage_or_ray(server: Server) -> None:
    """Containment on the real server, on paths a sandbox would see if they were not hidden.

    The session's directory is outside /tmp and outside any home (see conftest), and a file put
    there is readable from the run (the positive control), so only the server's hiding stands
    between the run and each target; each must read as missing ("No such file or directory"),
    not merely as forbidden, which a permission bit would also give.
    """
    marker = unique("other-run-secret")
    project, other = _other_projects_finished_run(server, marker)
    # The targets, found on the host (not computed the way the server computes its hidden paths).
    copies = [p for p in server.sandbox_root.rglob("notes.txt") if marker.encode() in p.read_bytes()]
    assert copies, "the other run's workspace file is on the host"
    workspace_file = copies[0]
    key_file = server.home / ".nodus" / "secret.key"
    session_dir = Path(server.cluster()["session_dir"])
    ray_log = next(log for log in server.ray_logs() if session_dir in log.parents)
    assert key_file.is_file()
    probe = server.base / unique("visible") / "probe.txt"
    probe.parent.mkdir(mode=0o755)
    probe.write_text("visible-from-the-sandbox\n")
    probe.chmod(0o644)
    for path in (server.storage, server.sandbox_root, server.home, session_dir, probe):
        assert not str(path.resolve()).startswith("/tmp/"), (
            f"{path}: under /tmp the check would prove nothing"
        )
    commands = {
        "probe": f"cat {probe}",
        "workspace": f"cat {workspace_file}",
        "sandbox root": f"ls -A {server.sandbox_root}",
        "key": f"cat {key_file}",
        "storage root": f"ls -A {server.storage}",
        "storage below": f"ls {server.storage}/projects",
        "ray session": f"ls -A {session_dir}",
        "ray log": f"cat {ray_log}",
    }
    local = server.storage_uri == str(server.storage)
    if local:  # on S3 the journal is in a bucket the run has no network to reach
        journal = server.storage / "projects" / project / "agentruns" / other
        [segment, *_] = sorted(p for p in journal.rglob("*") if p.is_file() and "journal" in p.parts)
        assert marker.encode() in b"".join(p.read_bytes() for p in journal.rglob("*") if p.is_file())
        commands["journal"] = f"cat {segment}"
    agent = unique("contain-agent")
    _agent(server, agent)
    run = _finished_run(server, agent, list(commands.values()))
    assert run["status"]["phase"] == "Succeeded", run["status"]
    steps = [s["detail"] for s in _steps(server, run["metadata"]["name"]) if s["kind"] == "command"]
    assert [s["command"] for s in steps] == list(commands.values())
    got = {
        name: (s["result"]["exit_code"], s["result"]["output"])
        for name, s in zip(commands, steps, strict=True)
    }
    assert got.pop("probe") == (0, "visible-from-the-sandbox\n")
    # Empty mounts: the directories are there and list nothing, not even the projects' names.
    assert got.pop("sandbox root") == (0, "") and got.pop("storage root") == (0, "")
    # Ray's session reads as missing (its temp dir is hidden) or as an empty mount (it is).
    exit_code, output = got.pop("ray session")
    assert (exit_code, output) == (0, "") or (exit_code != 0 and "No such file or directory" in output)
    key = key_file.read_text().strip()
    for name, (exit_code, output) in got.items():
        assert exit_code != 0 and "No such file or directory" in output, (name, exit_code, output)
        assert marker not in output and key not in output, name


def test_a_missing_secret_fails_the_run_naming_the_entry(server: Server) -> None:
    agent = unique("sec-missing")
    _agent(
        server, agent, env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "nowhere", "key": "K"}}}]
    )
    run = _finished_run(server, agent, ["echo hi"])
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "SecretNotFound")
    assert "spec.env[0] (TOKEN)" in run["status"]["message"]


def test_agent_env_is_checked_when_the_agent_is_saved(server: Server) -> None:
    with server.http() as http:
        for spec, field in [
            ({"env": [{"name": "PATH", "value": "/evil"}]}, "spec.env[0].name"),
            (
                {
                    "env": [
                        {"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "K"}}}
                    ]
                },
                "spec.env[0]",
            ),
            ({"network": {"allowedHosts": ["https://pypi.org/simple"]}}, "spec.network.allowedHosts[0]"),
        ]:
            refused = http.put(
                f"{BASE}/agents/bad-env",
                json={"apiVersion": V1, "kind": "Agent", "metadata": {"name": "bad-env"}, "spec": spec},
            )
            assert refused.status_code == 422 and refused.json()["details"]["field"] == field, refused.text


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        body = b"hello from outside\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def outside() -> Iterator[str]:
    """A web server standing in for the internet, on 127.0.0.2 (the session's operator opens it)."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.2", 0), _Hello)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.2:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def _fetch(url: str, *, proxy: bool = True) -> str:
    """One line of shell that prints the page, or a traceback and FAILED (urllib honours http_proxy)."""
    opener = "u.build_opener()" if proxy else "u.build_opener(u.ProxyHandler({}))"
    return f"python3 -c \"import urllib.request as u; print({opener}.open('{url}', timeout=10).read().decode())\" || echo FAILED"


def test_a_run_reaches_only_its_allowed_hosts_and_every_connection_is_recorded(
    server: Server, outside: str
) -> None:
    agent = unique("net-agent")
    port = outside.split(":")[1]
    _agent(server, agent, network={"allowedHosts": ["127.0.0.2"]})
    run = _finished_run(
        server,
        agent,
        [
            _fetch(f"http://{outside}/hello"),
            _fetch(f"http://127.0.0.3:{port}/"),
            _fetch(f"http://{outside}/", proxy=False),
        ],
    )
    assert run["status"]["phase"] == "Succeeded", run["status"]
    allowed, refused, direct = _outputs(server, run["metadata"]["name"])
    assert "hello from outside" in allowed
    assert "FAILED" in refused and "403" in refused
    assert "FAILED" in direct  # no route around the proxy: the sandbox has no network of its own
    commands = [step for step in _steps(server, run["metadata"]["name"]) if step["kind"] == "command"]
    first, second, third = (step["detail"]["result"].get("egress") or [] for step in commands)
    assert [(c["host"], c["port"], c["outcome"], c["reason"]) for c in first] == [
        ("127.0.0.2", int(port), "allowed", None)
    ]
    assert first[0]["bytesDown"] > len("hello from outside") and first[0]["method"] == "GET"
    assert [(c["host"], c["outcome"], c["reason"]) for c in second] == [
        ("127.0.0.3", "refused", "HostNotAllowed")
    ]
    assert third == []
    assert commands[0]["summary"].endswith("exit 0, 1 connection")
    assert commands[1]["summary"].endswith("1 connection (1 refused)")
    logs = server.cli("agentrun", "logs", run["metadata"]["name"])
    assert f"egress GET 127.0.0.2:{port} allowed" in logs.stdout
    assert "egress GET 127.0.0.3" in logs.stdout and "refused (HostNotAllowed)" in logs.stdout


def test_without_allowed_hosts_a_run_has_no_network_at_all(server: Server, outside: str) -> None:
    agent = unique("no-net")
    _agent(server, agent)
    run = _finished_run(server, agent, [_fetch(f"http://{outside}/hello"), "env | grep -ci proxy || true"])
    fetched, proxies = _outputs(server, run["metadata"]["name"])
    assert "FAILED" in fetched and "hello from outside" not in fetched
    assert proxies.strip().endswith("0")
