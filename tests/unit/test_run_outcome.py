"""The answer preview a run's status carries: the first 4 KiB, cut on a character boundary."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nodus.lifecycle import RunPhase
from nodus.resources import ANSWER_PREVIEW_BYTES
from nodus_ray.runtime.run_actor import RunActor, RunConfig


def _actor(tmp_path: Path) -> RunActor:
    return RunActor(
        RunConfig(
            project="p",
            name="r",
            agent="a",
            agent_revision=1,
            agent_spec={},
            run_spec={"agent": "a", "input": "x"},
            storage_uri=str(tmp_path / "s"),
            workspace=str(tmp_path / "w"),
            deadline_at=None,
        )
    )


def test_long_answers_are_previewed_and_flagged(tmp_path: Path) -> None:
    answer = "é" * ANSWER_PREVIEW_BYTES  # 2 bytes each: twice the preview
    outcome = _actor(tmp_path)._outcome(
        RunPhase.SUCCEEDED, "Completed", None, SimpleNamespace(turns=[], cost_usd=0), answer=answer
    )
    assert outcome.answer is not None
    preview = outcome.answer["preview"]
    assert len(preview.encode()) <= ANSWER_PREVIEW_BYTES
    assert len(preview.encode()) >= ANSWER_PREVIEW_BYTES - 1
    assert answer.startswith(preview)
    assert outcome.answer == {"preview": preview, "bytes": 2 * ANSWER_PREVIEW_BYTES, "truncated": True}
    assert outcome.finishedAt
    assert outcome.to_patch()["answer"] == outcome.answer and outcome.to_patch()["phase"] == "Succeeded"


def test_short_answers_are_whole(tmp_path: Path) -> None:
    outcome = _actor(tmp_path)._outcome(
        RunPhase.SUCCEEDED, "Completed", None, SimpleNamespace(turns=[], cost_usd=0), answer="4"
    )
    assert outcome.answer == {"preview": "4", "bytes": 1, "truncated": False}


def test_the_actor_names_itself_for_the_dashboard(tmp_path: Path) -> None:
    assert repr(_actor(tmp_path)) == "RunActor(run=p/r, agent=a@1, phase=Pending)"


def test_a_sandbox_still_opening_when_the_run_ends_is_deleted_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel or a passed deadline cancels the program while its sandbox opens in a thread;
    the deletion waits for that open, so the ended run leaves no workspace behind."""
    import threading

    from nodus_ray.runtime import run_actor as run_actor_module
    from nodus_ray.sandbox import create_sandbox

    actor = _actor(tmp_path)
    opening, release = threading.Event(), threading.Event()

    def slow_create(*args: Any, **kwargs: Any) -> Any:
        opening.set()
        assert release.wait(30)
        return create_sandbox(*args, **kwargs)  # creates the workspace directory

    monkeypatch.setattr(run_actor_module, "create_sandbox", slow_create)
    opener = threading.Thread(target=actor._open_sandbox)
    opener.start()
    assert opening.wait(30)
    deleter = threading.Thread(target=actor._delete_sandbox)
    deleter.start()
    release.set()
    opener.join(30)
    deleter.join(30)
    assert not (tmp_path / "w").exists(), "the workspace the open created was deleted after it"
    with pytest.raises(RuntimeError, match="has ended"):
        actor._open_sandbox()
    assert not (tmp_path / "w").exists()
