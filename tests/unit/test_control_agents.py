"""AgentService over real local storage: revisions, refusals, and what a restart reads back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nodus.errors import Conflict, Invalid, NotFound
from tests.unit.test_control_support import agent_doc, make_plane, run_doc


def test_each_changed_spec_is_a_new_revision_stored_before_the_agent(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        agents = plane.services.agents
        first = await agents.apply_agent("demo", agent_doc(maxToolCalls=3), mode="create")
        assert first["result"] == "created" and first["resource"]["status"]["revision"] == 1
        assert (await agents.apply_agent("demo", agent_doc(maxToolCalls=3)))["result"] == "unchanged"
        second = await agents.apply_agent("demo", agent_doc(maxToolCalls=4))
        assert second["result"] == "configured" and second["resource"]["status"]["revision"] == 2
        assert second["resource"]["metadata"]["uid"] == first["resource"]["metadata"]["uid"]
        stored = plane.storage.read_json("projects/demo/agents/helper/agent.json")
        assert stored["status"]["revision"] == 2
        assert (
            plane.storage.read_json("projects/demo/agents/helper/revisions/000001.json")["spec"][
                "maxToolCalls"
            ]
            == 3
        )
        assert (
            plane.storage.read_json("projects/demo/agents/helper/revisions/000002.json")["spec"][
                "maxToolCalls"
            ]
            == 4
        )

        restarted = await plane.restart()
        again = await restarted.services.agents.get_agent("demo", "helper")
        assert again["status"]["revision"] == 2
        assert [a["metadata"]["name"] for a in await restarted.services.agents.list_agents("demo")] == [
            "helper"
        ]

    asyncio.run(scenario())


def test_refusals_name_their_reason_and_store_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        agents = plane.services.agents
        await agents.apply_agent("demo", agent_doc(), mode="create")
        with pytest.raises(Conflict) as exists:
            await agents.apply_agent("demo", agent_doc(), mode="create")
        assert exists.value.code == "AlreadyExists"
        with pytest.raises(Invalid) as unpriced:
            await agents.apply_agent("demo", agent_doc("other", model={"name": "no-such-model"}))
        assert unpriced.value.code == "UnpricedModel"
        with pytest.raises(Invalid) as byok:
            await agents.apply_agent("demo", agent_doc("other", model={"access": "BYOK"}))
        assert byok.value.details["field"] == "spec.model.apiKeySecret"
        with pytest.raises(Invalid) as project:
            await agents.apply_agent("Not_A_Label", agent_doc())
        assert project.value.details["field"] == "project"
        assert plane.storage.list_dir("projects/demo/agents") == ["helper"]
        with pytest.raises(NotFound):
            await agents.get_agent("demo", "other")

    asyncio.run(scenario())


def test_an_agent_with_an_unfinished_run_is_not_deleted(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        agents, runs = plane.services.agents, plane.services.runs
        await agents.apply_agent("demo", agent_doc())
        await runs.create_run("demo", run_doc("r1"))
        with pytest.raises(Conflict) as refused:
            await agents.delete_agent("demo", "helper")
        assert "unfinished runs (r1)" in refused.value.message
        await runs.cancel_run("demo", "r1")
        await agents.delete_agent("demo", "helper")
        assert plane.storage.list_dir("projects/demo/agents") == []
        assert await agents.list_agents("demo") == []

    asyncio.run(scenario())
