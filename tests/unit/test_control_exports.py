"""ExportService over a control plane with real storage, secrets and a real Environment.

An evaluation larger than a page comes back whole when its pages are joined (Inspect's log one
JSON document, JSONL one line a case, Parquet one row a case); a run's export masks a secret
its journal held unmasked; each bad request is refused with its code and field.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from nodus.errors import Conflict, Invalid, NotFound
from nodus_ray.control import exports
from nodus_ray.control.exports import ExportService
from nodus_ray.durable.journal import Journal
from nodus_ray.export.page import ExportPage
from nodus_ray.store import layout
from tests.support.export_checks import check_atif, check_inspect_log
from tests.unit.test_control_support import Plane, agent_doc, group_doc, make_plane, run_doc

ENVIRONMENT = "nodus/arithmetic-v2@2.0.0"
VALUE = "tok-8c1f2e9a77"


def _service(plane: Plane) -> ExportService:
    services = plane.services
    return ExportService(services.registry, services.evaluations, services.secrets)


async def _pages(service: ExportService, name: str, format: str) -> list[ExportPage]:
    pages = [await service.export_evaluation("demo", name, format, 0)]
    while (after := pages[-1].next_page) is not None:
        pages.append(await service.export_evaluation("demo", name, format, after))
    return pages


def test_an_evaluation_larger_than_a_page_exports_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exports, "PAGE_CASES", 7)  # 15 cases: pages of 7, 7 and 1
    tasks = 15

    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc(system="Be brief."))
        await plane.services.groups.apply_group(
            "demo", group_doc("big", evaluation={"environment": ENVIRONMENT, "tasks": tasks})
        )
        service = _service(plane)
        inspect = await _pages(service, "big", "inspect")
        assert len(inspect) == 3 and inspect[0].media_type == "application/json"
        log = json.loads(b"".join(page.data for page in inspect))
        check_inspect_log(log)
        assert log["status"] == "started" and len(log["samples"]) == tasks
        assert len({sample["id"] for sample in log["samples"]}) == tasks
        assert log["samples"][0]["messages"][0] == {"role": "system", "content": "Be brief."}
        lines = b"".join(page.data for page in await _pages(service, "big", "jsonl")).splitlines()
        assert len(lines) == tasks and json.loads(lines[-1])["group"] == "big"
        parquet = await _pages(service, "big", "parquet")
        assert len(parquet) == 1 and pq.read_table(io.BytesIO(parquet[0].data)).num_rows == tasks

    asyncio.run(scenario())


def test_a_run_export_masks_a_secret_its_journal_kept_and_bad_requests_are_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        secret = {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "api"}}
        await plane.services.secrets.apply_secret("demo", {**secret, "stringData": {"TOKEN": VALUE}})
        env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "TOKEN"}}}]
        await plane.services.agents.apply_agent("demo", agent_doc(system="x", env=env))
        await plane.services.runs.create_run("demo", run_doc("r1", input=f"say {VALUE}"))
        journal = Journal(plane.storage, layout.journal_generation_folder("demo", "r1", 0))
        journal.load()
        journal.append_many(
            [("message-0", "message", "Completed", {"role": "user", "content": f"say {VALUE}"}, 1, "0")]
        )
        service = _service(plane)
        atif = await service.export_run("demo", "r1", "atif")
        check_atif(json.loads(atif.data))
        jsonl = await service.export_run("demo", "r1", "JSONL")
        for page in (atif, jsonl):
            assert VALUE.encode() not in page.data and b"[REDACTED:api/TOKEN]" in page.data

        with pytest.raises(Invalid) as unknown:
            await service.export_run("demo", "r1", "inspect")
        assert unknown.value.code == "UnsupportedFormat" and unknown.value.details["field"] == "format"
        with pytest.raises(NotFound):
            await service.export_run("demo", "nobody", "atif")
        await plane.services.groups.apply_group("demo", group_doc("plain"))
        with pytest.raises(Conflict) as plain:
            await service.export_evaluation("demo", "plain", "jsonl")
        assert plain.value.code == "NotAnEvaluation"
        with pytest.raises(NotFound):
            await service.export_evaluation("demo", "nothing", "jsonl")

    asyncio.run(scenario())
