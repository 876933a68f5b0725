"""Exports of a run's trajectory and an evaluation's cases (``GET .../export?format=``).

The control plane is the one reader of storage, so it builds each export here from what it
already keeps (the run, its pinned agent, its journal; the evaluation's case records) with the
pure builders of `nodus_ray.export`, and hands back bytes. A run's export is one document. An
evaluation's is served in pages of `PAGE_CASES` cases (`ExportPage.next_page`), which the API
streams one after another, so an evaluation's transcripts are never one answer in this actor's
memory or one Ray object, however many cases it has; Parquet, whose footer indexes the whole file, is one page.

Secrets: a run masks its secret values when it journals (`core.redaction`); every export masks
them again, with the values the run's agent names now and its model key, over the whole
document, so what was written before masking existed, a user's own prompt, or a program's step
result that carried one is masked too. A value whose secret was deleted since cannot be looked
up: what the run journaled was masked when it was written.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from nodus.errors import NodusError
from nodus.export_formats import (
    MEDIA_TYPES,
    EvaluationExportFormat,
    RunExportFormat,
    evaluation_export_format,
    run_export_format,
)
from nodus_ray.control.evaluations import EvaluationService
from nodus_ray.control.generations import run_journal
from nodus_ray.control.registry import Registry
from nodus_ray.control.retention_policy import check_payloads
from nodus_ray.control.secret_service import SecretService
from nodus_ray.core.redaction import Redactor
from nodus_ray.durable.journal_log import JournalRecord
from nodus_ray.export.atif import trajectory
from nodus_ray.export.case_table import case_lines, cases_parquet
from nodus_ray.export.inspect_log import TAIL, eval_header, eval_sample, head, model_of
from nodus_ray.export.journal_jsonl import journal_lines
from nodus_ray.export.page import ExportPage
from nodus_ray.store import layout

__all__ = ["ExportPage", "ExportService", "PAGE_CASES"]

PAGE_CASES = 50  # cases a page of an evaluation's export holds (each inspect sample reads a journal)
_GROUP_TERMINAL = {"Succeeded", "Failed", "Cancelled"}
_Values = dict[tuple[str, Any], dict[str, str]]  # (agent, revision) -> the values its runs mask


class ExportService:
    """Builds exports; reads only (the run and group views, journals, pinned agents)."""

    def __init__(self, registry: Registry, evaluations: EvaluationService, secrets: SecretService) -> None:
        self._registry = registry
        self._evaluations = evaluations
        self._secrets = secrets

    # -- a run ------------------------------------------------------------------------------

    async def export_run(self, project: str, name: str, format: str) -> ExportPage:
        """The run's trajectory: ``atif`` (one JSON document) or ``jsonl`` (its journal records)."""
        chosen = run_export_format(format)
        run = self._registry.run(project, name)
        check_payloads(run, "trajectory")  # 410 once retention deleted its payloads
        redact = await self._redactor(project, name)
        records = await asyncio.to_thread(self._journal, project, name, run)
        if chosen is RunExportFormat.JSONL:
            return ExportPage(b"".join(journal_lines(records, redact)), MEDIA_TYPES[chosen.value])
        agent = await asyncio.to_thread(self._pinned_agent, project, name)
        document = trajectory(run, agent.get("spec") or {}, records, redact)
        data = json.dumps(document, ensure_ascii=False, indent=2).encode("utf-8") + b"\n"
        return ExportPage(data, MEDIA_TYPES[chosen.value])

    def _journal(self, project: str, name: str, run: dict[str, Any]) -> list[JournalRecord]:
        return run_journal(self._registry.storage, (project, name), run["status"]).load()

    def _pinned_agent(self, project: str, name: str) -> dict[str, Any]:
        try:
            agent: dict[str, Any] = self._registry.storage.read_json(layout.run_agent(project, name))
        except FileNotFoundError:
            return {}
        return agent

    async def _redactor(self, project: str, name: str) -> Redactor:
        return Redactor(await self._values(project, name))

    async def _values(self, project: str, name: str) -> dict[str, str]:
        """The values to mask in the run's export: its env's secrets and its model key."""
        values: dict[str, str] = {}
        try:
            values.update((await self._secrets.run_secrets(project, name))["redact"])
        except NodusError:
            pass  # a secret deleted since: the journal was masked when it was written
        try:
            key = (await self._secrets.model_access(project, name)).get("apiKey")
        except NodusError:
            key = None
        if key:
            values["model/apiKey"] = str(key)
        return values

    # -- an evaluation ----------------------------------------------------------------------

    async def export_evaluation(self, project: str, name: str, format: str, page: int = 0) -> ExportPage:
        """Page ``page`` of the evaluation's cases as ``parquet``, ``jsonl`` or ``inspect``."""
        chosen = evaluation_export_format(format)
        # NotFound, NotAnEvaluation (409), PayloadExpired (410) come from here.
        answer = await self._evaluations.group_results(project, name)
        group = self._registry.group(project, name)
        evaluation: dict[str, Any] = answer.get("evaluation") or {}
        records: list[dict[str, Any]] = list(answer.get("items") or [])
        redactors: _Values = {}
        media = MEDIA_TYPES[chosen.value]
        if chosen is EvaluationExportFormat.PARQUET:
            redact = await self._group_redactor(project, records, redactors)
            data = await asyncio.to_thread(cases_parquet, name, evaluation, records, redact)
            return ExportPage(data, media)
        first = max(0, page) * PAGE_CASES
        part = records[first : first + PAGE_CASES]
        after = page + 1 if first + PAGE_CASES < len(records) else None
        if chosen is EvaluationExportFormat.JSONL:
            redact = await self._group_redactor(project, records, redactors)
            return ExportPage(b"".join(case_lines(name, evaluation, part, redact)), media, after)
        chunks: list[bytes] = []
        if first == 0:
            runs = [self._registry.runs.get((project, str(r.get("run")))) for r in records[:20]]
            finished = group["status"].get("phase") in _GROUP_TERMINAL
            chunks.append(head(eval_header(group, records, model_of(runs), finished)))
        for index, record in enumerate(part):
            sample = await self._sample(project, record, redactors)
            separator = b"," if first + index > 0 else b""
            chunks.append(separator + json.dumps(sample, ensure_ascii=False, separators=(",", ":")).encode())
        if after is None:
            chunks.append(TAIL)
        return ExportPage(b"".join(chunks), media, after)

    async def _run_values(self, project: str, run: dict[str, Any], cache: _Values) -> dict[str, str]:
        """Looked up once per agent revision: an evaluation's runs share theirs."""
        pinned = (str(run["spec"].get("agent")), run["status"].get("agentRevision"))
        if pinned not in cache:
            cache[pinned] = await self._values(project, run["metadata"]["name"])
        return cache[pinned]

    async def _group_redactor(self, project: str, records: list[dict[str, Any]], cache: _Values) -> Redactor:
        """The values of every agent revision the cases' runs pinned (a grader's evidence may
        quote what a run wrote)."""
        values: dict[str, str] = {}
        for record in records:
            run = self._registry.runs.get((project, str(record.get("run"))))
            if run is not None:
                values.update(await self._run_values(project, run, cache))
        return Redactor(values)

    async def _sample(self, project: str, record: dict[str, Any], cache: _Values) -> dict[str, Any]:
        run = self._registry.runs.get((project, str(record.get("run"))))
        if run is None:  # the case's run was deleted: its record is all there is
            return eval_sample(record, None, None, [], Redactor({}))
        name = run["metadata"]["name"]
        redact = Redactor(await self._run_values(project, run, cache))
        records = await asyncio.to_thread(self._journal, project, name, run)
        agent = await asyncio.to_thread(self._pinned_agent, project, name)
        system = (agent.get("spec") or {}).get("system")
        return eval_sample(record, run, system, records, redact)
