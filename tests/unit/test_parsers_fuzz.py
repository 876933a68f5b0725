"""Property tests of everything that parses what a user sends: YAML files, resources, run lists,
patches and durations. Whatever the input, the answer is a resource or a `NodusError` that names
a field: never another exception (which the API would turn into a 500 and the CLI into a
traceback)."""

from __future__ import annotations

import io
import string
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nodus.cli.manifests import load_manifests
from nodus.errors import BadRequest, Invalid, NodusError, PayloadTooLarge
from nodus.input_limits import MAX_BODY_BYTES, MAX_NESTING_DEPTH, decode_json_body
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


# -- nesting depth, size limits, merge patches that remove what a resource needs, strict types --


def _nest(depth: int, kinds: list[bool]) -> str:
    """``depth`` levels of arrays and objects (``kinds[i]``: an object at level i)."""
    opened = "".join('{"k":' if kinds[i % len(kinds)] else "[" for i in range(depth))
    closed = "".join("}" if kinds[i % len(kinds)] else "]" for i in reversed(range(depth)))
    return opened + "1" + closed


@FUZZ
@given(
    depth=st.integers(min_value=1, max_value=200_000), kinds=st.lists(st.booleans(), min_size=1, max_size=5)
)
@example(depth=100_000, kinds=[False])
@example(depth=50_000, kinds=[True])
@example(depth=MAX_NESTING_DEPTH, kinds=[True, False])
@example(depth=MAX_NESTING_DEPTH + 1, kinds=[True, False])
def test_a_json_body_of_any_depth_is_read_or_refused_as_too_deep(depth: int, kinds: list[bool]) -> None:
    text = _nest(depth, kinds).encode()
    if len(text) > MAX_BODY_BYTES:
        with pytest.raises(PayloadTooLarge):
            decode_json_body(text)
        return
    if depth <= MAX_NESTING_DEPTH:
        assert decode_json_body(text) is not None
        return
    with pytest.raises(BadRequest, match="nested more than"):
        decode_json_body(text)
    with pytest.raises(BadRequest):  # unclosed, as the 500s observed were: too deep or not JSON
        decode_json_body(text[: text.index(b"1")])


@FUZZ
@given(st.binary(max_size=200))
@example(b"NaN")
@example(b"[Infinity]")
@example(b"1" * 5000)
@example(b"\xff\xfe")
def test_any_bytes_are_json_or_a_4xx(raw: bytes) -> None:
    try:
        decode_json_body(raw)
    except NodusError as refusal:
        assert 400 <= refusal.status < 500 and refusal.details["field"] == ""


def test_a_body_over_the_limit_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(PayloadTooLarge):
        decode_json_body(b"[" * (MAX_BODY_BYTES + 1))
    assert decode_json_body(b'"' + b"x" * (MAX_BODY_BYTES - 2) + b'"')


_CURRENT_AGENT = {
    "apiVersion": "nodus.dev/v1",
    "kind": "Agent",
    "metadata": {"name": "a", "labels": {"team": "x"}},
    "spec": {
        "system": "keep me",
        "model": {"access": "Nodus", "families": ["haiku"]},
        "maxTokens": 77,
        "maxToolCalls": 5,
        "perRunMaxCostUSD": "5.00",
        "state": "Running",
        "env": [{"name": "A", "value": "1"}],
        "network": {"allowedHosts": ["pypi.org"]},
    },
}
_CURRENT_GROUP = {
    "apiVersion": "nodus.dev/v1",
    "kind": "AgentGroup",
    "metadata": {"name": "a"},
    "spec": {"agent": "helper", "limits": {"maxActive": 3, "maxPending": 9}, "maxCostUSD": "2.00"},
}
PATCH_VALUES = st.one_of(st.none(), VALUES)
_SPEC_FIELDS = sorted({*_CURRENT_AGENT["spec"], *_CURRENT_GROUP["spec"], "sealed", "image", "evaluation"})


def _patches() -> st.SearchStrategy[dict[str, Any]]:
    spec = st.dictionaries(st.sampled_from(_SPEC_FIELDS), PATCH_VALUES, max_size=4)
    nested = st.dictionaries(
        st.sampled_from(["model", "limits", "network"]),
        st.dictionaries(
            st.sampled_from(["access", "families", "maxActive", "maxPending", "allowedHosts"]),
            PATCH_VALUES,
            max_size=3,
        ),
        max_size=2,
    )
    return st.dictionaries(
        st.sampled_from(["spec", "metadata", "apiVersion", "kind", "status"]),
        st.one_of(
            st.none(),
            spec,
            nested,
            st.fixed_dictionaries(
                {
                    "labels": st.one_of(
                        st.none(),
                        st.dictionaries(st.text(max_size=4), st.none() | st.text(max_size=4), max_size=2),
                    )
                }
            ),
        ),
        max_size=3,
    )


@FUZZ
@given(current=st.sampled_from([_CURRENT_AGENT, _CURRENT_GROUP]), patch=_patches())
@example(current=_CURRENT_AGENT, patch={"spec": None})
@example(current=_CURRENT_AGENT, patch={"spec": {"system": None}})
@example(current=_CURRENT_GROUP, patch={"spec": {"limits": None}})
@example(current=_CURRENT_GROUP, patch={"spec": {"agent": None}})
def test_a_merge_patch_never_puts_a_default_in_place_of_a_value(
    current: dict[str, Any], patch: dict[str, Any]
) -> None:
    """Whatever the patch, each field of the result is what the patch set, or what it was
    before, or removed where removing is a state of its own (unset, or an empty collection)."""
    try:
        resource = parse_resource(patched_document(current, patch, "a"))
    except NodusError as refusal:
        assert refusal.details.get("field") is not None and refusal.status == 422
        return
    after = resource.model_dump(mode="json", exclude_none=True)["spec"]
    spec_patch: dict[str, Any] = patch["spec"] if isinstance(patch.get("spec"), dict) else {}
    for field, before in current["spec"].items():
        if field not in spec_patch:
            if isinstance(before, dict):  # a sub-object: its fields keep their values
                assert {k: v for k, v in after[field].items() if k in before} == before, (field, patch)
            else:
                assert after[field] == before, (field, patch)
        elif spec_patch[field] is None:
            assert after.get(field) in (None, [], {}), (field, patch)


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        ("AgentRun", "keepAlive", "yes"),
        ("AgentRun", "keepAlive", 1),
        ("AgentGroup", "sealed", "true"),
        ("Agent", "maxTokens", "100"),
        ("Agent", "maxTokens", True),
        ("Agent", "maxTokens", 100.0),
        ("Agent", "maxToolCalls", "5"),
        ("Agent", "system", 5),
        ("Agent", "perRunMaxCostUSD", 0.5),
    ],
)
def test_types_are_strict(kind: str, field: str, value: Any) -> None:
    spec: dict[str, Any] = {"AgentRun": {"agent": "a"}, "AgentGroup": {"agent": "a"}, "Agent": {}}[kind]
    document = {
        "apiVersion": "nodus.dev/v1",
        "kind": kind,
        "metadata": {"name": "a"},
        "spec": {**spec, field: value},
    }
    with pytest.raises(Invalid) as refused:
        parse_resource(document)
    assert refused.value.details["field"] == f"spec.{field}"


def _deep_yaml(depth: int, flow: bool) -> str:
    if flow:
        return (
            "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {name: a}\nspec: "
            + "[" * depth
            + "]" * depth
            + "\n"
        )
    lines = ["apiVersion: nodus.dev/v1", "kind: Agent", "metadata: {name: a}", "spec:"]
    lines += ["  " * (level + 1) + f"k{level}:" for level in range(depth)]
    return "\n".join(lines) + "\n" + "  " * (depth + 1) + "v\n"


def _alias_bomb(width: int, levels: int) -> str:
    lines = [
        "apiVersion: nodus.dev/v1",
        "kind: Agent",
        "metadata: {name: a}",
        "x0: &x0 [" + ", ".join(["lol"] * width) + "]",
    ]
    for level in range(1, levels + 1):
        lines.append(f"x{level}: &x{level} [" + ", ".join([f"*x{level - 1}"] * width) + "]")
    lines.append(f"spec: {{system: *x{levels}}}")
    return "\n".join(lines) + "\n"


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    text=st.one_of(
        st.builds(_deep_yaml, st.integers(min_value=MAX_NESTING_DEPTH - 3, max_value=400), st.just(False)),
        st.builds(_deep_yaml, st.integers(min_value=MAX_NESTING_DEPTH - 3, max_value=20_000), st.just(True)),
        st.builds(
            _alias_bomb, st.integers(min_value=2, max_value=12), st.integers(min_value=1, max_value=12)
        ),
    )
)
@example(text=_deep_yaml(100_000, flow=True))
@example(text=_alias_bomb(9, 9))  # a billion laughs
@example(text="a: &x [*x, *x]\n")
def test_deep_or_exploding_yaml_is_refused_with_the_file_name(tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        manifests = load_manifests([str(path)], stdin=io.StringIO(""))
    except NodusError as refusal:
        assert str(path) in refusal.message and "\n" not in refusal.message
        return
    assert manifests  # small enough: an ordinary document (refused or not by its schema above)
