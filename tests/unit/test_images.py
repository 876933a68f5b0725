"""spec.image: references parsed, resolved to a digest, unpacked once per node, and run on.

The images are built here from busybox-static (`tests.support.images`), never pulled.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

import nodus
from nodus.errors import Invalid
from nodus.image_ref import parse_image_ref
from nodus.resources import parse_resource
from nodus_ray.control import evaluation_plan
from nodus_ray.control.evaluation_plan import plan_evaluation
from nodus_ray.control.run_images import LocalImages, pin_images
from nodus_ray.environments.arithmetic import ArithmeticV2
from nodus_ray.sandbox import bwrap_available
from nodus_ray.sandbox import images as images_module
from nodus_ray.sandbox.bubblewrap import BubblewrapSandbox
from nodus_ray.sandbox.images import ImageError, image_root, inside_root, resolve_digest, run_image
from tests.support.images import MARKER, TestImages, tools_missing

pytestmark = pytest.mark.skipif(tools_missing() is not None, reason=str(tools_missing()))
needs_bwrap = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap cannot run here")
DIGEST_ZERO = "sha256:" + "0" * 64


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> TestImages:
    return TestImages(tmp_path_factory.mktemp("images"))


# -- references ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "transport", "location", "tag"),
    [
        ("docker://alpine", "docker", "alpine", None),
        ("docker://alpine:3.20", "docker", "alpine", "3.20"),
        ("docker://ghcr.io/org/tools:v1", "docker", "ghcr.io/org/tools", "v1"),
        ("docker://localhost:5000/a/b", "docker", "localhost:5000/a/b", None),
        ("oci:/images/layout", "oci", "/images/layout", None),
        ("oci:/images/layout:v1", "oci", "/images/layout", "v1"),
        ("oci-archive:/images/a.tar:busybox", "oci-archive", "/images/a.tar", "busybox"),
    ],
)
def test_references_parse(text: str, transport: str, location: str, tag: str | None) -> None:
    ref = parse_image_ref(text)
    assert (ref.transport, ref.location, ref.tag) == (transport, location, tag)
    assert str(ref) == text


def test_a_pinned_registry_reference_keeps_its_digest() -> None:
    digest = "sha256:" + "ab" * 32
    ref = parse_image_ref(f"docker://alpine:3.20@{digest}")
    assert ref.digest == digest and str(ref) == f"docker://alpine:3.20@{digest}"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ubuntu:24.04", "docker://ubuntu:24.04"),
        ("", "empty"),
        ("docker://Alpine", "lowercase"),
        ("docker://alpine:bad tag", "spaces"),
        ("docker://alpine@sha256:123", "docker://"),
        ("oci:relative/path", "absolute path"),
        ("oci:/a/b:bad/tag", "tag"),
        ("oci-archive:", "absolute path"),
        ("oci:/", "absolute path"),
        ("http://example.com/image", "forms"),
        ("docker-daemon:alpine", "forms"),
    ],
)
def test_malformed_references_are_refused_naming_the_field(text: str, says: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_image_ref(text)
    assert says in str(refused.value)
    document = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Agent",
        "metadata": {"name": "a"},
        "spec": {"image": text},
    }
    with pytest.raises(Invalid) as invalid:
        parse_resource(document)
    assert invalid.value.details["field"] == "spec.image"


def test_the_sdk_refuses_a_malformed_image_at_once() -> None:
    with pytest.raises(Invalid) as invalid:
        nodus.ClaudeAgent("helper", image="ubuntu")
    assert invalid.value.details["field"] == "spec.image"
    assert "docker://ubuntu" in str(invalid.value)
    assert (
        nodus.Agent("plain", image="oci:/images/tools:v1")._manifest["spec"]["image"]
        == "oci:/images/tools:v1"
    )


# -- resolving ------------------------------------------------------------------------------


def _layout_digest(ref: str) -> str:
    layout, tag = ref[len("oci:") :].rsplit(":", 1)
    index = json.loads((Path(layout) / "index.json").read_text())
    (entry,) = [m for m in index["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == tag]
    return str(entry["digest"])


def test_a_reference_resolves_to_its_manifest_digest(images: TestImages) -> None:
    ref = images.busybox()
    digest = resolve_digest(ref)
    raw = subprocess.run(["skopeo", "inspect", "--raw", ref], capture_output=True, check=True).stdout
    assert digest == "sha256:" + hashlib.sha256(raw).hexdigest() == _layout_digest(ref)
    assert resolve_digest(images.archive()) == digest  # the same image, in a tar


def test_an_unknown_image_names_the_reference(images: TestImages, tmp_path: Path) -> None:
    unknown_tag = images.busybox().rsplit(":", 1)[0] + ":nope"
    for ref in (unknown_tag, f"oci:{tmp_path}/missing:x", f"oci-archive:{tmp_path}/none.tar"):
        with pytest.raises(ImageError) as failed:
            resolve_digest(ref)
        assert ref in str(failed.value) and "cannot be pulled" in str(failed.value)


# -- unpacking ------------------------------------------------------------------------------


def test_a_digest_is_unpacked_once(
    images: TestImages, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = images.busybox()
    digest = resolve_digest(ref)
    builds: list[str] = []
    real_build = images_module._build

    def counted(*args: Any, **kwargs: Any) -> Any:
        builds.append(digest)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(images_module, "_build", counted)
    root = image_root(tmp_path, ref, digest)
    assert (root.rootfs / MARKER.lstrip("/")).read_text() == "busybox\n"
    assert root.shell == "/bin/sh" and root.python is None  # busybox has no bash
    assert root.rootfs == tmp_path / digest.removeprefix("sha256:") / "rootfs"
    again = image_root(tmp_path, ref, digest)
    assert again == root and len(builds) == 1
    # Only the finished root and its lock remain: the build's temporary directory is gone.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([digest[7:], f"{digest[7:]}.lock"])


def test_two_runs_on_a_node_unpack_once(
    images: TestImages, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = images.archive()
    digest = resolve_digest(ref)
    builds: list[int] = []
    inside = threading.Event()
    release = threading.Event()
    real_build = images_module._build

    def slow(*args: Any, **kwargs: Any) -> Any:
        builds.append(1)
        inside.set()
        assert release.wait(timeout=60)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(images_module, "_build", slow)
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(image_root(tmp_path, ref, digest))) for _ in range(2)
    ]
    threads[0].start()
    assert inside.wait(timeout=60)  # the first holds the lock and builds
    threads[1].start()
    release.set()
    for thread in threads:
        thread.join(timeout=120)
    assert len(builds) == 1 and len(results) == 2 and results[0] == results[1]


def test_a_digest_that_does_not_match_the_pin_is_refused(images: TestImages, tmp_path: Path) -> None:
    ref = images.busybox()
    with pytest.raises(ImageError) as failed:
        image_root(tmp_path, ref, DIGEST_ZERO)
    assert ref in str(failed.value) and "changed" in str(failed.value)
    assert not (tmp_path / DIGEST_ZERO[7:]).exists()
    with pytest.raises(ImageError, match="not a sha256 digest"):
        image_root(tmp_path, ref, "sha256:abc")


def test_an_image_without_a_shell_is_refused(images: TestImages, tmp_path: Path) -> None:
    ref = images.no_shell()
    digest = resolve_digest(ref)
    with pytest.raises(ImageError) as failed:
        image_root(tmp_path, ref, digest)
    assert ref in str(failed.value) and "/bin/sh" in str(failed.value)
    assert not (tmp_path / digest[7:]).exists()  # nothing half-built is left to be found


def test_a_program_needs_the_images_python(images: TestImages, tmp_path: Path) -> None:
    ref = images.busybox()
    pinned = {"ref": ref, "digest": resolve_digest(ref)}
    assert run_image(None, str(tmp_path)) is None
    assert run_image(pinned, str(tmp_path)) is not None
    for need in ({"program": True}, {"egress": True}):
        with pytest.raises(ImageError) as failed:
            run_image(pinned, str(tmp_path), **need)
        assert ref in str(failed.value) and "python3" in str(failed.value)


def test_symlinks_resolve_inside_the_image(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/dash").write_text("")
    (root / "bin").symlink_to("usr/bin")
    (root / "usr/bin/sh").symlink_to("/usr/bin/dash")  # absolute: the image's, not the host's
    (root / "usr/bin/escape").symlink_to("/../../../etc/passwd")
    assert inside_root(root, "/bin/sh") == root / "usr/bin/dash"
    assert inside_root(root, "/usr/bin/escape") is None  # never the host's /etc/passwd
    assert inside_root(root, "/bin/bash") is None


# -- running on an image --------------------------------------------------------------------


@needs_bwrap
def test_commands_run_on_the_images_root(images: TestImages, tmp_path: Path) -> None:
    ref = images.busybox()
    root = image_root(tmp_path / "cache", ref, resolve_digest(ref))
    sandbox = BubblewrapSandbox(tmp_path / "ws", uid=300_901, image=root)
    try:
        seen = sandbox.run(f"cat {MARKER}; echo $0; ls /; pwd; echo kept > file; cat file")
        assert seen.exit_code == 0, seen.output
        lines = seen.output.splitlines()
        assert lines[0] == "busybox" and lines[1] == "sh"
        assert "usr" not in lines and "bin" in lines  # the image's root, not the host's
        assert lines[-2:] == ["/tmp/workspace", "kept"]
        assert (tmp_path / "ws" / "file").read_text() == "kept\n"
        for refused in ("touch /bin/x", "ls /work /root /etc/passwd"):
            assert sandbox.run(refused).exit_code != 0
        if os.geteuid() == 0:
            assert sandbox.run("id -u").output.strip() == "300901"  # dropped, as on the host's root
        limited = sandbox.run("ulimit -t; ulimit -u")
        assert limited.output.split() == [str(sandbox.limits.cpu_seconds), str(sandbox.limits.processes)]
    finally:
        sandbox.delete()


@needs_bwrap
def test_without_an_image_commands_run_on_the_hosts_root(tmp_path: Path) -> None:
    sandbox = BubblewrapSandbox(tmp_path / "ws", uid=300_902)
    try:
        seen = sandbox.run("echo $0; test -d /usr/bin && echo host")
        assert seen.output.split() == ["bash", "host"], seen.output
    finally:
        sandbox.delete()


# -- evaluations ------------------------------------------------------------------------------

_EVALUATION = {"agent": "solver", "evaluation": {"environment": "nodus/arithmetic-v2@2.0.0", "tasks": 2}}
_CREATED = "2026-01-01T00:00:00Z"


def test_an_evaluation_records_the_digest_its_cases_run_on(images: TestImages) -> None:
    ref = images.busybox()
    local = LocalImages((str(images.root),))
    status, _ = asyncio.run(plan_evaluation("ev", _EVALUATION, _CREATED, agent_image=ref, local_images=local))
    assert status["imageDigest"] == resolve_digest(ref)
    assert (status["image"], status["imageFrom"]) == (ref, "Agent")
    plain, _ = asyncio.run(plan_evaluation("ev", _EVALUATION, _CREATED))
    assert plain["imageDigest"] is None and "image" not in plain


def test_an_environments_image_is_the_one_recorded(
    images: TestImages, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Imaged(ArithmeticV2):
        image = images.archive()

    monkeypatch.setattr(evaluation_plan, "resolve", lambda ref: Imaged())
    local = LocalImages((str(images.root),))
    status, _ = asyncio.run(
        plan_evaluation("ev", _EVALUATION, _CREATED, agent_image=images.no_shell(), local_images=local)
    )
    assert status["imageDigest"] == resolve_digest(images.archive())
    assert (status["image"], status["imageFrom"]) == (images.archive(), "Environment")


def test_an_evaluation_on_an_unknown_image_is_refused(images: TestImages) -> None:
    missing = images.busybox().rsplit(":", 1)[0] + ":absent"
    with pytest.raises(Invalid) as refused:
        local = LocalImages((str(images.root),))
        asyncio.run(plan_evaluation("ev", _EVALUATION, _CREATED, agent_image=missing, local_images=local))
    assert refused.value.code == "ImagePullFailed" and refused.value.details["field"] == "spec.agent"
    assert missing in str(refused.value)


def test_local_images_are_read_only_under_the_operators_directories(
    images: TestImages, tmp_path: Path
) -> None:
    # Any token that may create an Agent names the reference: a local path is read only inside
    # NODUS_IMAGE_PATHS (none by default), links and '..' resolved first.
    ref = images.busybox()
    allowed = LocalImages.parse(str(images.root))
    assert allowed.refusal(ref) is None and allowed.refusal("docker://alpine:3.20") is None
    assert LocalImages().refusal("docker://alpine:3.20") is None
    nothing = LocalImages().refusal(ref)
    assert nothing is not None and "NODUS_IMAGE_PATHS" in nothing and "none are set" in nothing
    elsewhere = LocalImages.parse(str(tmp_path))
    assert elsewhere.refusal(ref) is not None
    escape = f"oci:{tmp_path}/../{images.root.name}/{ref.split('/')[-1]}"
    assert elsewhere.refusal(escape) is not None  # '..' out of the allowed directory
    link = tmp_path / "link"
    link.symlink_to(images.root, target_is_directory=True)
    assert elsewhere.refusal(f"oci:{link}/{ref.split('/')[-1]}") is not None  # a link out of it
    with pytest.raises(ValueError, match="NODUS_IMAGE_PATHS"):
        LocalImages.parse("relative/dir")
    pins = asyncio.run(pin_images([ref], LocalImages(), timeout=5))
    assert ref in pins.failed and "NODUS_IMAGE_PATHS" in pins.failed[ref]
    plain = asyncio.run(pin_images([ref], allowed, timeout=30))
    assert plain.pinned == {ref: resolve_digest(ref)}
    with pytest.raises(Invalid) as refused:
        asyncio.run(plan_evaluation("ev", _EVALUATION, _CREATED, agent_image=ref))
    assert refused.value.code == "ImagePullFailed" and "NODUS_IMAGE_PATHS" in str(refused.value)
