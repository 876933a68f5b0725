"""spec.image through the real service: runs pinned to a digest, commands on the image's root.

The images are built by the test session from busybox-static (`tests.support.images`) in the
session's own directory, which the server reads as local OCI layouts: never a registry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodus_ray.sandbox.images import resolve_digest
from tests.support.images import MARKER, TestImages, python_missing, tools_missing

from . import kit
from .conftest import Server, unique, wait_for

pytestmark = pytest.mark.skipif(tools_missing() is not None, reason=str(tools_missing()))

V1 = "nodus.dev/v1"


@pytest.fixture(scope="module")
def images(server: Server) -> TestImages:
    root = server.base / "test-images"
    root.mkdir(exist_ok=True)
    return TestImages(root)


def _put_agent(server: Server, name: str, **spec: Any) -> Any:
    with server.http() as http:
        return http.put(
            f"{kit.AGENTS}/{name}",
            json={
                "apiVersion": V1,
                "kind": "Agent",
                "metadata": {"name": name},
                "spec": {"system": "Run what you are asked.", "perRunMaxCostUSD": "0.10", **spec},
            },
        )


def _agent(server: Server, **spec: Any) -> str:
    name = unique("img")
    answer = _put_agent(server, name, **spec)
    assert answer.status_code == 201, answer.text
    return name


def _create_run(server: Server, agent: str, commands: list[str]) -> str:
    name = unique("img-run")
    with server.http() as http:
        created = http.post(
            kit.RUNS,
            json={
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": name},
                # The offline model runs each line after "run:" verbatim.
                "spec": {"agent": agent, "input": "run:\n" + "\n".join(commands)},
            },
        )
        assert created.status_code == 201, created.text
    return name


def _ended(server: Server, name: str, timeout: float = 120) -> dict[str, Any]:
    with server.http() as http:
        run: dict[str, Any] = wait_for(
            lambda: (
                (r := http.get(f"{kit.RUNS}/{name}").json())["status"]["phase"] in ("Succeeded", "Failed")
                and r
            ),
            timeout=timeout,
            message=f"run {name} to end",
        )
        return run


def _outputs(server: Server, name: str) -> list[str]:
    with server.http() as http:
        steps = http.get(f"{kit.RUNS}/{name}/steps").json()["items"]
    return [step["detail"]["result"]["output"] for step in steps if step["kind"] == "command"]


def test_a_run_on_an_image_sees_the_images_root(server: Server, images: TestImages) -> None:
    ref = images.busybox()
    agent = _agent(server, image=ref)
    name = _create_run(
        server, agent, [f"cat {MARKER}", "ls /", "echo $0", "echo kept > note && cat note", "touch /bin/x"]
    )
    run = _ended(server, name)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert run["status"]["sandbox"]["image"] == {"ref": ref, "digest": resolve_digest(ref)}
    assert run["status"]["sandbox"]["backend"] == "bubblewrap"
    marker, root, shell, kept, read_only = _outputs(server, name)
    assert marker.splitlines()[-1] == "busybox"  # the image's file, which the host has not
    assert set(root.split()) == {"bin", "dev", "etc", "proc", "tmp"}  # not the host's /usr, /work...
    assert shell.strip() == "sh" and kept.strip() == "kept"  # busybox's sh; the workspace is writable
    assert "Read-only file system" in read_only
    assert (kit.workspace_of(server, name) / "note").read_text() == "kept\n"


def test_an_oci_archive_runs_the_same_image(server: Server, images: TestImages) -> None:
    ref = images.archive()
    name = _create_run(server, _agent(server, image=ref), [f"cat {MARKER}"])
    run = _ended(server, name)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert run["status"]["sandbox"]["image"]["digest"] == resolve_digest(images.busybox())
    assert _outputs(server, name)[0].splitlines()[-1] == "busybox"


def test_an_unknown_image_fails_the_run_at_once(server: Server, images: TestImages) -> None:
    ref = images.busybox().rsplit(":", 1)[0] + ":no-such-tag"
    name = _create_run(server, _agent(server, image=ref), ["echo never"])
    run = _ended(server, name)
    status = run["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "ImagePullFailed"), status
    assert ref in status["message"]
    assert not status.get("attempts") and not status.get("actorName")  # no actor was ever started
    assert status["sandbox"].get("image") is None


def test_an_image_without_a_shell_fails_the_run(server: Server, images: TestImages) -> None:
    ref = images.no_shell()
    name = _create_run(server, _agent(server, image=ref), ["echo never"])
    status = _ended(server, name)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "ImagePullFailed"), status
    assert ref in status["message"] and "/bin/sh" in status["message"]
    assert status["sandbox"]["image"]["digest"] == resolve_digest(ref)  # resolved; the node refused it


def test_a_malformed_reference_is_refused_naming_the_field(
    server: Server, images: TestImages, tmp_path: Path
) -> None:
    name = unique("img-bad")
    refused = _put_agent(server, name, image="ubuntu:24.04")
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["code"] == "Invalid" and body["details"]["field"] == "spec.image"
    assert "docker://ubuntu:24.04" in body["message"]
    agent = _agent(server, image=images.busybox())
    with server.http() as http:
        patched = http.patch(f"{kit.AGENTS}/{agent}", json={"spec": {"image": "oci:relative/path"}})
        assert patched.status_code == 422 and patched.json()["details"]["field"] == "spec.image"
        assert http.get(f"{kit.AGENTS}/{agent}").json()["spec"]["image"] == images.busybox()  # unchanged
    manifest = tmp_path / "agent.yaml"
    manifest.write_text(_manifest(unique("img-cli"), "docker://Bad"))
    applied = server.cli("apply", "-f", str(manifest))
    assert applied.returncode != 0
    assert "spec.image" in applied.stderr and len(applied.stderr.strip().splitlines()) == 1, applied.stderr


def _manifest(name: str, image: str) -> str:
    return f"apiVersion: {V1}\nkind: Agent\nmetadata:\n  name: {name}\nspec:\n  image: {image}\n"


def test_an_evaluation_records_the_digest(server: Server, images: TestImages) -> None:
    ref = images.busybox()
    agent = _agent(server, image=ref, model={"access": "Nodus", "families": ["haiku"]})
    name = unique("img-eval")
    kit.group(
        server,
        name,
        agent,
        maxCostUSD="0.20",
        evaluation={"environment": "nodus/arithmetic-v2@2.0.0", "tasks": 1, "timeout": "5m"},
    )
    group = kit.finished(server, name, timeout=300)
    evaluation = group["status"]["evaluation"]
    digest = resolve_digest(ref)
    assert (evaluation["imageDigest"], evaluation["image"], evaluation["imageFrom"]) == (digest, ref, "Agent")
    (member,) = kit.runs_of(server, name)
    assert member["status"]["sandbox"]["image"] == {"ref": ref, "digest": digest}


PROGRAM = """
import sys


def main(ctx, input):
    marker = ctx.step("marker", lambda: open("/etc/nodus-image").read().strip())
    return {"python": sys.executable, "version": list(sys.version_info[:2]), "marker": marker}
"""


def test_a_python_agent_runs_on_the_images_python(server: Server, images: TestImages) -> None:
    missing = python_missing()
    if missing:
        pytest.skip(f"no python image can be built here: {missing}")
    ref = images.python()
    with server.http() as http:
        uploaded = http.post("/v1/projects/default/agentsources", json={"files": {"main.py": PROGRAM}})
        assert uploaded.status_code == 201, uploaded.text
    agent = unique("img-py")
    put = _put_agent(server, agent, source=uploaded.json(), entrypoint="main:main", image=ref)
    assert put.status_code == 201, put.text
    name = unique("img-pyrun")
    with server.http() as http:
        created = http.post(
            kit.RUNS,
            json={"apiVersion": V1, "kind": "AgentRun", "metadata": {"name": name}, "spec": {"agent": agent}},
        )
        assert created.status_code == 201, created.text
    run = _ended(server, name)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    with server.http() as http:
        answer = http.get(f"{kit.RUNS}/{name}/answer").json()["answer"]
    assert '"marker": "python"' in answer, answer  # the image's file
    assert '"python": "/usr/bin/python3' in answer, answer  # the image's interpreter, not the server's


def test_a_python_agent_on_an_image_without_python_fails_clearly(server: Server, images: TestImages) -> None:
    ref = images.busybox()
    with server.http() as http:
        uploaded = http.post("/v1/projects/default/agentsources", json={"files": {"main.py": PROGRAM}})
    agent = unique("img-nopy")
    assert (
        _put_agent(server, agent, source=uploaded.json(), entrypoint="main:main", image=ref).status_code
        == 201
    )
    name = unique("img-nopyrun")
    with server.http() as http:
        created = http.post(
            kit.RUNS,
            json={"apiVersion": V1, "kind": "AgentRun", "metadata": {"name": name}, "spec": {"agent": agent}},
        )
        assert created.status_code == 201, created.text
    status = _ended(server, name)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "ImagePullFailed"), status
    assert ref in status["message"] and "python3" in status["message"]
