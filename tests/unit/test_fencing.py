"""Fencing on real storage (a local directory, and S3 through a local moto server): two writers
of one run's journal, the older of which must stop at its next write and never overwrite."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from typing import Any

import pytest

from nodus_ray.durable.fencing import Epoch, Fenced, JournalConflict
from nodus_ray.durable.journal import Journal
from nodus_ray.durable.steps import Steps
from nodus_ray.store import layout
from nodus_ray.store.storage import AlreadyExists, Storage
from tests.fakes.s3 import CREDENTIALS, local_s3

RUN = layout.run_prefix("p", "r")
JOURNAL = layout.journal_folder("p", "r")


@pytest.fixture(scope="module")
def s3_uri() -> Iterator[str]:
    with local_s3("fencing-unit") as endpoint:
        yield f"s3://fencing-unit/root?endpoint_override={endpoint}&scheme=http&region=us-east-1"


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Storage:
    if request.param == "local":
        return Storage(str(tmp_path / "store"))
    for variable, value in CREDENTIALS.items():
        monkeypatch.setenv(variable, value)
    uri: str = request.getfixturevalue("s3_uri")
    # A fresh root per test in the shared bucket.
    return Storage(uri.replace("/root?", f"/{tmp_path.name}?"))


def test_a_created_object_is_never_replaced(storage: Storage) -> None:
    storage.create_bytes("a/one", b"first")
    with pytest.raises(AlreadyExists):
        storage.create_bytes("a/one", b"second")
    assert storage.read_bytes("a/one") == b"first"


def test_two_writers_of_one_seq_the_second_gets_a_conflict_and_the_first_record_stays(
    storage: Storage,
) -> None:
    first, second = Journal(storage, JOURNAL), Journal(storage, JOURNAL)
    first.load()
    second.load()
    first.append("s1", "command", "Started", {"by": "first"})
    with pytest.raises(JournalConflict):
        second.append("s1", "command", "Started", {"by": "second"})
    (record,) = Journal(storage, JOURNAL).load()
    assert record.payload == {"by": "first"}


def test_an_epoch_is_held_once_and_a_newer_one_fences_the_older(storage: Storage) -> None:
    old, new = Epoch(storage, RUN, 1), Epoch(storage, RUN, 2)
    old.claim()
    with pytest.raises(Fenced):
        Epoch(storage, RUN, 1).claim()  # the same attempt twice: never two holders
    new.claim()
    with pytest.raises(Fenced) as fenced:
        old.check()
    assert (fenced.value.attempt, fenced.value.newest) == (1, 2)
    new.check()
    with pytest.raises(Fenced):
        Epoch(storage, RUN, 1).claim()  # an actor started late for an old attempt never runs


def test_a_fenced_writer_writes_nothing(storage: Storage) -> None:
    old = Epoch(storage, RUN, 1)
    old.claim()
    zombie = Journal(storage, JOURNAL, fence=old.check)
    zombie.load()
    zombie.append("s1", "model", "Started")
    Epoch(storage, RUN, 2).claim()
    with pytest.raises(Fenced):
        zombie.append("s1", "model", "Completed", {"result": {}})
    assert [r.state for r in Journal(storage, JOURNAL).load()] == ["Started"]


def test_a_zombie_woken_after_its_started_stops_before_the_effect_and_the_replacement_does_it_once(
    storage: Storage,
) -> None:
    """The zombie writes Started and freezes; the replacement claims, loads, runs the step (a
    new attempt) and records it; the zombie wakes and checks its epoch before the effect."""
    effects: list[str] = []
    old = Epoch(storage, RUN, 1)
    old.claim()
    zombie_journal = Journal(storage, JOURNAL, fence=old.check)
    zombie_journal.load()
    real_append = zombie_journal.append_many

    def append_then_freeze(*args: Any, **kwargs: Any) -> Any:
        written = real_append(*args, **kwargs)
        if written[0].state == "Started":  # frozen here; meanwhile the replacement does its work
            new = Epoch(storage, RUN, 2)
            new.claim()
            journal = Journal(storage, JOURNAL, fence=new.check)
            journal.load()

            async def replacement_effect() -> dict[str, Any]:
                effects.append("replacement")
                return {"ok": True}

            # Another process in truth: its own thread and event loop (a local append runs on the
            # zombie's loop, which is frozen here).
            with concurrent.futures.ThreadPoolExecutor(1) as other:
                replacement = Steps(journal).run("turn-1/model-1", "model", replacement_effect)
                result = other.submit(asyncio.run, replacement).result()
            assert result == {"ok": True}
        return written

    zombie_journal.append_many = append_then_freeze  # type: ignore[method-assign]

    async def zombie_effect() -> dict[str, Any]:
        effects.append("zombie")
        return {"ok": True}

    with pytest.raises(Fenced):
        asyncio.run(Steps(zombie_journal).run("turn-1/model-1", "model", zombie_effect))
    assert effects == ["replacement"]
    records = Journal(storage, JOURNAL).load()
    started = [r.attempt for r in records if r.state == "Started"]
    assert started == [1, 2], "one Started per attempt"
    assert [r.state for r in records][-1] == "Completed"
    assert records[-1].attempt == 2


def test_a_replacement_that_loaded_before_a_zombie_wrote_gets_a_conflict_not_an_overwrite(
    storage: Storage,
) -> None:
    """The zombie's write lands between the replacement's load and its own write of that seq."""
    old, new = Epoch(storage, RUN, 1), Epoch(storage, RUN, 2)
    old.claim()
    zombie = Journal(storage, JOURNAL)  # its check passed before the claim below: no fence left to stop it
    zombie.load()
    new.claim()
    replacement = Journal(storage, JOURNAL, fence=new.check)
    replacement.load()
    zombie.append("s1", "command", "Started", {"by": "zombie"})
    with pytest.raises(JournalConflict):
        replacement.append("s1", "command", "Started", {"by": "replacement"})
    (record,) = Journal(storage, JOURNAL).load()
    assert record.payload == {"by": "zombie"}  # kept, and seen by the next load as interrupted
