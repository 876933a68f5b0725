"""Label and field selectors (`nodus.selectors`): every operator, every refusal, and a round trip.

The parser is the one the server, the CLI and the SDK share, so what is checked here is what all
three accept and refuse: Kubernetes' grammar, one `BadRequest` (400) naming the parameter.
"""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodus.errors import BadRequest, Invalid
from nodus.resources import parse_resource
from nodus.selectors import (
    FIELDS,
    MAX_LIMIT,
    FieldOperator,
    LabelOperator,
    LabelRequirement,
    LabelSelector,
    label_problem,
    parse_field_selector,
    parse_label_selector,
    parse_limit,
)

LABELS = {"team": "a", "env": "prod", "tier": "gold", "empty": "", "nodus.dev/task-id": "test-001"}


def _matches(selector: str, labels: dict[str, str] | None = None) -> bool:
    return parse_label_selector(selector).matches(LABELS if labels is None else labels)


# -- label selectors: each operator -----------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("team=a", True),
        ("team=b", False),
        ("team==a", True),
        ("team = a", True),
        ("team!=a", False),
        ("team!=b", True),
        ("absent!=x", True),  # as in Kubernetes: != matches an object without the label
        ("tier in (gold,silver)", True),
        ("tier in (silver, bronze)", False),
        ("absent in (x)", False),
        ("tier notin (gold)", False),
        ("tier notin (silver,bronze)", True),
        ("absent notin (x)", True),
        ("team", True),
        ("absent", False),
        ("!absent", True),
        ("!team", False),
        ("empty=", True),
        ("empty", True),
        ("nodus.dev/task-id=test-001", True),
        ("team=a,env=prod", True),  # a comma is AND
        ("team=a,env!=prod", False),
        ("team=a, tier in (gold,silver), !absent", True),
        ("", True),  # an empty selector selects everything
    ],
)
def test_each_label_operator(selector: str, expected: bool) -> None:
    assert _matches(selector) is expected


def test_the_parsed_form_is_canonical() -> None:
    selector = parse_label_selector(" team == a , tier in ( silver , gold ) ,!gone, has ")
    assert selector.requirements == (
        LabelRequirement("team", LabelOperator.EQUALS, ("a",)),
        LabelRequirement("tier", LabelOperator.IN, ("gold", "silver")),
        LabelRequirement("gone", LabelOperator.DOES_NOT_EXIST),
        LabelRequirement("has", LabelOperator.EXISTS),
    )
    assert str(selector) == "team=a,tier in (gold,silver),!gone,has"
    assert parse_label_selector(str(selector)) == selector
    assert not parse_label_selector("  ") and parse_label_selector(None) == LabelSelector()


def test_a_resource_without_labels_matches_only_absence() -> None:
    assert parse_label_selector("!team,team!=a,team notin (a)").matches(None)
    assert not parse_label_selector("team").matches({})


# -- label selectors: refusals -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "says"),
    [
        ("a=b=c", "does not parse"),
        ("=x", "does not parse"),
        ("team=a,,env=b", "empty requirement"),
        ("team=a,", "empty requirement"),
        ("k in ()", "the set of values is empty"),
        ("k in (a", "'(' without ')'"),
        ("k in a)", "')' without '('"),
        ("k in (a,(b))", "may not nest"),
        ("Bad Key=1", "does not parse"),
        ("-bad=1", "label key '-bad'"),
        ("team=has space", "does not parse"),
        ("team=" + "v" * 64, "at most 63"),
        ("UPPER.prefix/name=1", "prefix before '/'"),
        ("k in (a,b c)", "value 'b c'"),
        ("!", "label key ''"),
        ("team=a" + ",x" * 2100, "at most 4096"),
    ],
)
def test_a_label_selector_that_does_not_parse_is_one_clear_400(selector: str, says: str) -> None:
    with pytest.raises(BadRequest) as raised:
        parse_label_selector(selector)
    error = raised.value
    assert error.status == 400 and error.code == "Invalid"
    assert error.details == {"field": "labelSelector"}
    assert str(error).startswith("labelSelector: ") and says in str(error), str(error)


def test_the_caller_names_the_parameter() -> None:
    with pytest.raises(BadRequest, match=r"^--selector: ") as raised:
        parse_label_selector("a=b=c", field="--selector")
    assert raised.value.details == {"field": "--selector"}


# -- field selectors ---------------------------------------------------------------------------

RUN: dict[str, Any] = {
    "metadata": {"name": "r-1", "creationTimestamp": "2026-12-03T11:00:00.500000Z"},
    "spec": {"agent": "helper", "group": "g1"},
    "status": {"phase": "Failed", "reason": "ModelError"},
}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("status.phase=Failed", True),
        ("status.phase==Failed", True),
        ("status.phase!=Failed", False),
        ("status.phase=Succeeded", False),
        ("status.reason=ModelError", True),
        ("status.reason!=ModelError", False),
        ("spec.agent=helper", True),
        ("spec.group=g1", True),
        ("spec.group!=g2", True),
        ("metadata.name=r-1", True),
        ("metadata.creationTimestamp>2026-12-03T11:00:00Z", True),
        ("metadata.creationTimestamp>2026-12-03T11:00:00.500000Z", False),
        ("metadata.creationTimestamp>=2026-12-03T11:00:00.5Z", True),
        ("metadata.creationTimestamp<2026-12-03T12:00:00+01:00", False),  # 11:00Z: not before
        ("metadata.creationTimestamp<=2026-12-03T12:00:00.5+01:00", True),
        ("metadata.creationTimestamp<2026-12-03T11:00:01Z", True),
        ("metadata.creationTimestamp=2026-12-03T11:00:00.5Z", True),
        ("metadata.creationTimestamp!=2026-12-03T11:00:00.5Z", False),
        ("status.phase=Failed,spec.group=g1,metadata.creationTimestamp<2027-01-01T00:00:00Z", True),
        ("status.phase=Failed,spec.group=g2", False),
    ],
)
def test_each_field_and_operator(selector: str, expected: bool) -> None:
    assert parse_field_selector(selector, "agentruns").matches(RUN) is expected


def test_an_absent_reason_is_empty_and_an_absent_time_matches_no_comparison() -> None:
    pending: dict[str, Any] = {
        "metadata": {"name": "p"},
        "spec": {"agent": "a"},
        "status": {"phase": "Pending"},
    }
    assert parse_field_selector("status.reason=", "agentruns").matches(pending)
    assert parse_field_selector("spec.group!=g1", "agentruns").matches(pending)
    assert not parse_field_selector("metadata.creationTimestamp>2000-01-01T00:00:00Z", "agentruns").matches(
        pending
    )


def test_groups_and_agents_have_their_own_fields() -> None:
    group = {"metadata": {"name": "g"}, "status": {"phase": "Cancelling"}}
    assert parse_field_selector("status.phase=Cancelling", "agentgroups").matches(group)
    assert str(parse_field_selector("metadata.name==a", "agents")) == "metadata.name=a"
    assert set(FIELDS["agentgroups"]) >= {"status.phase"} and "spec.group" not in FIELDS["agentgroups"]


@pytest.mark.parametrize(
    ("collection", "selector", "says"),
    [
        (
            "agentruns",
            "status.foo=1",
            "'status.foo' is not a field agentruns can be selected on; supported: status.phase, "
            "status.reason, spec.agent, spec.group, metadata.name, metadata.creationTimestamp",
        ),
        ("agentruns", "spec.model.name=x", "supported: status.phase"),
        ("agents", "status.phase=Running", "supported: metadata.name, metadata.creationTimestamp"),
        ("agentgroups", "spec.group=g", "is not a field agentgroups can be selected on"),
        ("agentruns", "status.phase=Runing", "'Runing' is not a status.phase; one of Pending, Running"),
        ("agentgroups", "status.phase=Waiting", "one of Running, Cancelling"),
        ("agentruns", "metadata.creationTimestamp>yesterday", "is not an RFC 3339 time"),
        ("agentruns", "metadata.creationTimestamp>2026-12-03", "is not an RFC 3339 time"),
        ("agentruns", "metadata.creationTimestamp>2026-13-03T00:00:00Z", "is not an RFC 3339 time"),
        ("agentruns", "spec.agent>a", "takes =, == or !="),
        ("agentruns", "spec.agent=a=b", "one operator per requirement"),
        ("agentruns", "status.phase", "does not parse"),
        ("agentruns", "status.phase=Failed,", "empty requirement"),
        ("secrets", "metadata.name=x", "supported: "),
    ],
)
def test_a_field_selector_refused_names_the_field_and_what_is_supported(
    collection: str, selector: str, says: str
) -> None:
    with pytest.raises(BadRequest) as raised:
        parse_field_selector(selector, collection)
    assert raised.value.status == 400 and raised.value.details == {"field": "fieldSelector"}
    assert str(raised.value).startswith("fieldSelector: ") and says in str(raised.value), str(raised.value)


def test_every_field_operator_has_a_spelling() -> None:
    spelled = {
        str(parse_field_selector(f"metadata.creationTimestamp{op}2026-12-03T00:00:00Z", "agentruns"))
        for op in ("=", "==", "!=", ">", ">=", "<", "<=")
    }
    assert {text.split("2026")[0].removeprefix("metadata.creationTimestamp") for text in spelled} == {
        op.value for op in FieldOperator
    }


# -- limits ------------------------------------------------------------------------------------


def test_a_limit_is_one_to_a_thousand() -> None:
    assert parse_limit(None) is None and parse_limit("") is None
    assert parse_limit("7") == 7 and parse_limit(MAX_LIMIT) == MAX_LIMIT
    for bad, says in (
        ("0", "out of range"),
        ("1001", "out of range"),
        ("-3", "out of range"),
        ("ten", "not a whole number"),
        ("1.5", "not a whole number"),
        (True, "not a whole number"),
    ):
        with pytest.raises(BadRequest, match=says) as raised:
            parse_limit(bad)  # type: ignore[arg-type]
        assert raised.value.details == {"field": "limit"} and "1 to 1000" in str(raised.value)


# -- labels on resources -----------------------------------------------------------------------


def _run_with(labels: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": "r", "labels": labels},
        "spec": {"agent": "a", "input": "hi"},
    }


def test_labels_follow_kubernetes_rules_when_a_resource_is_written() -> None:
    good = {"team": "a", "nodus.dev/task-id": "test-000", "empty": "", "A_b.c-d": "X.y_z-1"}
    assert parse_resource(_run_with(good)).metadata.labels == good
    for labels, says in (
        ({"bad key": "v"}, "label key 'bad key'"),
        ({"team": "has space"}, "label 'team': value 'has space'"),
        ({"team": "v" * 64}, "at most 63"),
        ({"Example.COM/x": "1"}, "prefix before '/'"),
        ({"/x": "1"}, "prefix before '/'"),
        ({"k" * 64: "1"}, "1-63 letters"),
    ):
        with pytest.raises(Invalid) as raised:
            parse_resource(_run_with(labels))
        assert raised.value.details["field"] == "metadata.labels" and says in str(raised.value), str(
            raised.value
        )
    assert label_problem("ok", "fine") is None


# -- round trip --------------------------------------------------------------------------------

_NAME = st.text(string.ascii_letters + string.digits, min_size=1, max_size=8)
_KEY = st.one_of(_NAME, st.builds(lambda p, n: f"{p.lower()}.io/{n}", _NAME, _NAME))
_VALUE = st.one_of(st.just(""), _NAME)
_REQUIREMENT = st.one_of(
    st.builds(lambda k, v: LabelRequirement(k, LabelOperator.EQUALS, (v,)), _KEY, _VALUE),
    st.builds(lambda k, v: LabelRequirement(k, LabelOperator.NOT_EQUALS, (v,)), _KEY, _VALUE),
    st.builds(
        lambda k, vs: LabelRequirement(k, LabelOperator.IN, tuple(sorted(set(vs)))),
        _KEY,
        st.lists(_NAME, min_size=1, max_size=4),
    ),
    st.builds(
        lambda k, vs: LabelRequirement(k, LabelOperator.NOT_IN, tuple(sorted(set(vs)))),
        _KEY,
        st.lists(_NAME, min_size=1, max_size=4),
    ),
    st.builds(lambda k: LabelRequirement(k, LabelOperator.EXISTS), _KEY),
    st.builds(lambda k: LabelRequirement(k, LabelOperator.DOES_NOT_EXIST), _KEY),
)


def _reference(requirement: LabelRequirement, labels: dict[str, str]) -> bool:
    """Kubernetes' meaning, written out apart from the implementation."""
    value = labels.get(requirement.key)
    # Each meaning is evaluated only for its own operator: exists / !k have no values to index.
    meanings = {
        LabelOperator.EQUALS: lambda: value is not None and value == requirement.values[0],
        LabelOperator.NOT_EQUALS: lambda: value is None or value != requirement.values[0],
        LabelOperator.IN: lambda: value is not None and value in requirement.values,
        LabelOperator.NOT_IN: lambda: value is None or value not in requirement.values,
        LabelOperator.EXISTS: lambda: value is not None,
        LabelOperator.DOES_NOT_EXIST: lambda: value is None,
    }
    return meanings[requirement.operator]()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_REQUIREMENT, min_size=1, max_size=5),
    st.dictionaries(_KEY, _VALUE, max_size=5),
    st.sampled_from(["", " "]),
)
def test_a_selector_written_out_parses_back_to_itself_and_means_what_kubernetes_means(
    requirements: list[LabelRequirement], labels: dict[str, str], space: str
) -> None:
    selector = LabelSelector(tuple(requirements))
    text = (space + "," + space).join(str(requirement) for requirement in requirements)
    parsed = parse_label_selector(text)
    assert parsed == selector
    assert parse_label_selector(str(parsed)) == parsed
    assert parsed.matches(labels) == all(_reference(r, labels) for r in requirements)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_any_text_parses_or_is_refused_as_a_400_never_anything_else(text: str) -> None:
    for parse in (parse_label_selector, lambda t: parse_field_selector(t, "agentruns")):
        try:
            parse(text)
        except BadRequest as error:
            assert error.status == 400 and error.details["field"] in ("labelSelector", "fieldSelector")
