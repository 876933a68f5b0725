"""An Agent's workers: ``spec.minWorkers``/``maxWorkers``/``scaledownWindow`` (issue 17, item 7)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from nodus.schema_agent import AgentSpec

# -- the schema -------------------------------------------------------------------------------


def test_worker_fields_are_optional_and_left_out_when_unset() -> None:
    assert not {"minWorkers", "maxWorkers", "scaledownWindow"} & set(
        AgentSpec().model_dump(exclude_none=True)
    )
    spec = AgentSpec(minWorkers=0, maxWorkers=1000, scaledownWindow="24h")
    assert (spec.minWorkers, spec.maxWorkers, spec.scaledownWindow) == (0, 1000, "24h")
    assert AgentSpec(minWorkers=64, maxWorkers=64, scaledownWindow="10s").minWorkers == 64


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"maxWorkers": 0}, "maxWorkers"),
        ({"maxWorkers": 1001}, "maxWorkers"),
        ({"maxWorkers": True}, "maxWorkers"),
        ({"minWorkers": -1}, "minWorkers"),
        ({"minWorkers": 65}, "minWorkers"),
        ({"minWorkers": 3, "maxWorkers": 2}, "spec.minWorkers (3) is more than spec.maxWorkers (2)"),
        ({"scaledownWindow": "9s"}, "10s..24h"),
        ({"scaledownWindow": "24h1s"}, "10s..24h"),
        ({"scaledownWindow": "soon"}, "not a duration"),
    ],
)
def test_worker_fields_out_of_range_are_refused_naming_them(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError) as caught:
        AgentSpec(**fields)
    assert named in str(caught.value)
