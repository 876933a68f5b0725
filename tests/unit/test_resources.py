"""The resource contract: what is accepted, and how each refusal names its field."""

from __future__ import annotations

import pytest

from nodus.errors import Invalid, PayloadTooLarge
from nodus.resources import MAX_INPUT_BYTES, Agent, AgentRun, parse_duration, parse_resource


def agent_doc(**spec: object) -> dict[str, object]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Agent", "metadata": {"name": "hello-agent"}, "spec": spec}


def run_doc(**spec: object) -> dict[str, object]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": "r"},
        "spec": {"agent": "hello-agent", **spec},
    }


def test_agent_defaults_come_from_the_documents() -> None:
    agent = parse_resource(agent_doc())
    assert isinstance(agent, Agent)
    assert agent.spec.maxToolCalls == 50
    assert agent.spec.perRunMaxCostUSD == "1.00"
    assert agent.spec.model.access == "Nodus"
    assert agent.spec.state == "Running"


def test_status_on_input_is_accepted_and_round_trips() -> None:
    doc = agent_doc(system="x")
    doc["status"] = {"revision": 7}
    assert isinstance(parse_resource(doc), Agent)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({**agent_doc(), "apiVersion": "nodus.dev/v2"}, "apiVersion"),
        ({**agent_doc(), "kind": "Pod"}, "kind"),
        ({**agent_doc(), "metadata": {"name": "Hello_Agent"}}, "metadata.name"),
        ({**agent_doc(), "metadata": {"name": "-x"}}, "metadata.name"),
        ({**agent_doc(), "metadata": {"name": "a" * 64}}, "metadata.name"),
        (agent_doc(perRunMaxCostUSD="cheap"), "spec.perRunMaxCostUSD"),
        (agent_doc(perRunMaxCostUSD=0.5), "spec.perRunMaxCostUSD"),
        (agent_doc(perRunMaxCostUSD="0"), "spec.perRunMaxCostUSD"),
        (agent_doc(perRunMaxCostUSD="-1.00"), "spec.perRunMaxCostUSD"),
        (agent_doc(model={"families": ["haiku", "gpt-4"]}), "spec.model.families[1]"),
        (agent_doc(model={"access": "Free"}), "spec.model.access"),
        (agent_doc(maxToolCalls=0), "spec.maxToolCalls"),
        (agent_doc(maxTokens="many"), "spec.maxTokens"),
        (agent_doc(sytem="typo"), "spec.sytem"),
        (agent_doc(state="Paused"), "spec.state"),
        ({**agent_doc(), "extra": 1}, "extra"),
        (run_doc(deadline="soon"), "spec.deadline"),
        (run_doc(keepalive=True), "spec.keepalive"),
        ({**run_doc(), "spec": {"input": "no agent"}}, "spec.agent"),
    ],
)
def test_refusals_name_the_offending_field(doc: dict[str, object], field: str) -> None:
    with pytest.raises(Invalid) as caught:
        parse_resource(doc)
    assert caught.value.details["field"] == field
    assert field in str(caught.value) or field in ("apiVersion", "kind")


def test_input_over_256_kib_is_payload_too_large() -> None:
    with pytest.raises(PayloadTooLarge) as caught:
        parse_resource(run_doc(input="x" * (MAX_INPUT_BYTES + 1)))
    assert caught.value.status == 413
    assert caught.value.details["field"] == "spec.input"
    # Exactly at the limit is accepted; multi-byte characters count as bytes.
    assert isinstance(parse_resource(run_doc(input="x" * MAX_INPUT_BYTES)), AgentRun)
    with pytest.raises(PayloadTooLarge):
        parse_resource(run_doc(input="é" * (MAX_INPUT_BYTES // 2 + 1)))


def test_a_mapping_is_required() -> None:
    with pytest.raises(Invalid):
        parse_resource(["not", "a", "mapping"])


def test_expected_kind_is_enforced() -> None:
    with pytest.raises(Invalid) as caught:
        parse_resource(agent_doc(), expected_kind="AgentRun")
    assert caught.value.details["field"] == "kind"


@pytest.mark.parametrize(("text", "seconds"), [("2h", 7200), ("30m", 1800), ("90s", 90), ("1h30m", 5400)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "2d", "h", "1.5h", "-1m", "30"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)
