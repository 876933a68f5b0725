"""Property tests of everything that parses what a user sends: YAML files, resources, run lists,
patches and durations. Whatever the input, the answer is a resource or a `NodusError` that names
a field: never another exception (which the API would turn into a 500 and the CLI into a
traceback)."""

from __future__ import annotations

import io
import string
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nodus.cli.manifests import load_manifests
from nodus.errors import NodusError
from nodus.resources import KINDS, parse_duration, parse_resource, parse_run_list
from nodus_ray.core.patch import patched_document

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# JSON-like values, with the strings and numbers that break naive code: huge, negative, unicode,
# NUL, and the names of real fields so the generator reaches deep into the schemas.
FIELDS = [
    "apiVersion",
    "kind",
    "metadata",
    "spec",
    "status",
    "name",
    "agent",
    "input",
    "group",
    "taskKey",
    "dependsOn",
    "deadline",
    "keepAlive",
    "limits",
    "maxActive",
    "maxPending",
    "maxCostUSD",
    "sealed",
    "state",
    "evaluation",
    "environment",
    "tasks",
    "repetitions",
    "seed",
    "timeout",
    "split",
    "model",
    "access",
    "families",
    "apiKeySecret",
    "perRunMaxCostUSD",
    "maxTokens",
    "stringData",
    "data",
    "items",
    "labels",
    "system",
    "image",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(
        [
            "nodus.dev/v1",
            *KINDS,
            "Agent",
            "a",
            "0.10",
            "30m",
            "nodus/arithmetic-v2@2.0.0",
            "BYOK",
            "Nodus",
            "haiku",
            "\x00",
            "é" * 70,
            "1e9",
            "-1",
            "Cancelled",
            "Stopped",
        ]
    ),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=8)), inner, max_size=6),
    ),
    max_leaves=30,
)


def _document(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    """A document of ``kind`` that is mostly right, so the fuzzing reaches the spec's fields."""
    return st.fixed_dictionaries(
        {
            "apiVersion": st.sampled_from(["nodus.dev/v1", "nodus.dev/v1", "v2"]),
            "kind": st.just(kind),
            "metadata": st.one_of(
                st.fixed_dictionaries({"name": st.one_of(st.sampled_from(["a", "run-1"]), SCALARS)}), VALUES
            ),
            "spec": st.one_of(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=8), VALUES),
        }
    )


@FUZZ
@given(st.one_of(VALUES, st.sampled_from(sorted(KINDS)).flatmap(_document)))
@example(
    {
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentGroup",
        "metadata": {"name": "g"},
        "spec": {
            "agent": "a",
            "evaluation": {"environment": "x/y@1", "tasks": 10**30, "repetitions": 10**30},
        },
    }
)
@example(
    {
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": "x" * 70},
        "spec": {"agent": "a", "group": "g" * 70, "taskKey": "k"},
    }
)
def test_parse_resource_answers_a_resource_or_a_field_error(document: Any) -> None:
    try:
        parsed = parse_resource(document)
    except NodusError as refusal:
        assert refusal.code and refusal.message
        assert "field" in refusal.details
        return
    assert parsed.kind == document["kind"]


@FUZZ
@given(
    st.one_of(
        VALUES,
        st.fixed_dictionaries(
            {
                "apiVersion": st.just("nodus.dev/v1"),
                "kind": st.just("AgentRunList"),
                "items": st.lists(st.one_of(_document("AgentRun"), VALUES), max_size=5),
            }
        ),
    )
)
def test_parse_run_list_names_the_item_it_refuses(document: Any) -> None:
    try:
        runs = parse_run_list(document)
    except NodusError as refusal:
        assert "field" in refusal.details
        return
    assert len(runs) == len(document["items"])


@FUZZ
@given(st.text(max_size=20))
@example("1h30m")
@example("99999999999999999999h")
def test_parse_duration_is_a_duration_or_a_value_error(text: str) -> None:
    try:
        duration = parse_duration(text)
    except ValueError:
        return
    assert duration.total_seconds() > 0


@FUZZ
@given(VALUES, VALUES)
def test_a_merge_patch_never_crashes_and_keeps_the_name(current: Any, patch: Any) -> None:
    document = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Agent",
        "metadata": {"name": "a"},
        "spec": {"system": ""},
    }
    if isinstance(current, dict):
        document["spec"] = current
    try:
        patched = patched_document(document, patch, "a")
    except NodusError as refusal:
        assert refusal.message
        return
    assert patched["metadata"]["name"] == "a"


def _yaml_texts() -> st.SearchStrategy[str]:
    dumped = VALUES.map(lambda value: yaml.safe_dump(value, allow_unicode=True))
    documents = st.sampled_from(sorted(KINDS)).flatmap(_document).map(lambda d: yaml.safe_dump(d))
    raw = st.text(alphabet=string.printable + "é\t", max_size=200)
    return st.one_of(
        dumped,
        documents,
        raw,
        st.lists(documents, min_size=1, max_size=3).map("---\n".join),
        st.sampled_from(
            [
                "!!python/object:os.system ['id']",
                "a: &x [*x]",
                "{",
                "- - -",
                "\x00",
                "kind: List\nitems: 3",
                "apiVersion: nodus.dev/v1\nkind: AgentRunList\nitems: []",
            ]
        ),
    )


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(text=_yaml_texts())
def test_a_yaml_file_loads_or_is_refused_with_its_name(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        manifests = load_manifests([str(path)], stdin=io.StringIO(""))
    except NodusError as refusal:
        assert refusal.message and str(path) in refusal.message or "no resources" in refusal.message
        return
    assert manifests and all(manifest.kind in KINDS for manifest in manifests)
