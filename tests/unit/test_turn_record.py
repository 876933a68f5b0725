"""The run actor's `TurnRecord` is the API's `Turn`, field for field.

The actor keeps its turns in a dataclass (no pydantic in a run's process, issue 19) and reports
them as dicts that the API serves as `Turn`; a field added to one and not the other would be
dropped or refused somewhere between them.
"""

from __future__ import annotations

from dataclasses import fields

from nodus.schema_run import Turn
from nodus_ray.runtime.turn_record import TurnRecord


def test_a_turn_record_has_the_fields_of_the_api_turn_with_the_same_defaults() -> None:
    record = TurnRecord(index=1)
    assert [f.name for f in fields(TurnRecord)] == list(Turn.model_fields)
    assert record.to_status() == Turn(index=1).model_dump()


def test_what_the_actor_reports_is_a_valid_turn() -> None:
    record = TurnRecord(index=2, prompt="hi", family="haiku", model="claude-haiku-5-5", routing="jev")
    record.inputTokens, record.costUSD, record.unpricedModels = 12, "0.000100", ["x"]
    assert Turn.model_validate(record.to_status()).model_dump() == record.to_status()
