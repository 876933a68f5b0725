"""Routing decisions, JSON merge patch and atomic storage writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodus_ray.core.patch import merge_patch
from nodus_ray.runtime.router import fallback_family, route
from nodus_ray.store.storage import Storage


def test_simple_prompts_go_to_the_cheapest_family() -> None:
    assert route("What is 2 + 2?", None).family == "haiku"
    assert route("What is 2 + 2?", None).routing == "jev"


def test_demanding_prompts_climb() -> None:
    prompt = "Design and analyze a distributed algorithm, prove it correct and compare the trade-offs."
    assert route(prompt, None).family in ("opus", "fable")


def test_the_choice_stays_within_the_allowed_families() -> None:
    prompt = "Design and analyze a distributed algorithm, prove it correct and compare the trade-offs."
    assert route(prompt, ["haiku", "sonnet"]).family == "sonnet"
    assert route("hi", ["opus"]).family == "opus"


def test_fallback_prefers_sonnet_then_the_nearest_family() -> None:
    assert fallback_family(["haiku", "sonnet", "opus"]) == "sonnet"
    assert fallback_family(["haiku", "opus"]) == "haiku"
    assert fallback_family(["opus", "fable"]) == "opus"


def test_merge_patch_follows_rfc_7386() -> None:
    target = {"spec": {"limits": {"maxActive": 2}, "sealed": False}, "keep": 1}
    patched = merge_patch(target, {"spec": {"limits": {"maxActive": 4}, "sealed": None}})
    assert patched == {"spec": {"limits": {"maxActive": 4}}, "keep": 1}
    assert target["spec"]["limits"]["maxActive"] == 2  # the original is untouched
    assert merge_patch({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}


def test_storage_round_trips_and_lists(storage_uri: str) -> None:
    storage = Storage(storage_uri)
    storage.write_json("projects/p/agents/a/agent.json", {"x": 1})
    storage.write_json("projects/p/agents/b/agent.json", {"x": 2})
    assert storage.read_json("projects/p/agents/a/agent.json") == {"x": 1}
    assert storage.list_dir("projects/p/agents") == ["a", "b"]
    assert storage.list_dir("projects/missing") == []
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("projects/p/agents/c/agent.json")
    storage.delete_tree("projects/p/agents/a")
    assert storage.list_dir("projects/p/agents") == ["b"]
    # No temporary files are left behind by atomic writes.
    assert storage.list_dir("projects/p/agents/b") == ["agent.json"]
    storage.delete("projects/p/agents/b/agent.json")
    assert not storage.exists("projects/p/agents/b/agent.json")


def test_storage_uris_are_shown_without_credentials() -> None:
    from nodus_ray.store.storage import redact_uri

    shown = redact_uri("s3://AKIAEXAMPLE:wJalrSECRET@bucket/prefix?region=us-east-1&secret_key=wJalrSECRET")
    assert "wJalrSECRET" not in shown and "AKIAEXAMPLE" not in shown
    assert shown.startswith("s3://***@bucket/prefix") and "region=us-east-1" in shown


def test_storage_refuses_keys_that_escape_the_root(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Storage(str(tmp_path)).write_bytes("../outside", b"x")


def test_storage_accepts_file_uris(tmp_path: Path) -> None:
    storage = Storage(f"file://{tmp_path}/via-uri")
    storage.write_json("k.json", [1])
    assert (tmp_path / "via-uri" / "k.json").exists()
