"""The export routes: a run's trajectory and an evaluation's cases, as files other tools read.

``GET .../agentruns/{name}/export?format=atif|jsonl`` and ``GET .../agentgroups/{name}/export
?format=parquet|jsonl|inspect``. Thin like every route: the format is checked here (an unknown
one is refused before the control plane is asked), the control plane builds the bytes
(`control.exports`). An evaluation's export comes in pages, which this route streams one after
another; the first page is asked for before the answer starts, so a refusal (no such group, not
an evaluation, its payloads expired) is still a 4xx ``{code, message, details}``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response, StreamingResponse

from nodus.errors import Invalid
from nodus.export_formats import (
    FILE_SUFFIXES,
    EvaluationExportFormat,
    RunExportFormat,
    evaluation_export_format,
    run_export_format,
)
from nodus_ray.control.client import ControlPlaneClient

__all__ = ["install_export_routes"]

_CONTENT: dict[str, dict[str, Any]] = {
    "application/json": {},
    "application/x-ndjson": {},
    "application/vnd.apache.parquet": {},
}


def _format(value: str | None, offered: type[RunExportFormat] | type[EvaluationExportFormat]) -> str:
    if value is None:
        names = ", ".join(f.value for f in offered)
        raise Invalid(f"format: required, one of {names}", details={"field": "format"})
    chosen = run_export_format(value) if offered is RunExportFormat else evaluation_export_format(value)
    return chosen.value


def _attachment(name: str, format: str) -> dict[str, str]:
    return {"Content-Disposition": f'attachment; filename="{name}{FILE_SUFFIXES[format]}"'}


def install_export_routes(app: FastAPI, cp: ControlPlaneClient, project_of: Callable[[str], str]) -> None:
    """Add the export routes; ``project_of`` checks a project name (`app._project`)."""

    @app.get(
        "/v1/projects/{project}/agentruns/{name}/export",
        response_class=Response,
        responses={200: {"description": "the run's trajectory", "content": _CONTENT}},
    )
    async def export_run(project: str, name: str, format: str | None = None) -> Response:
        """The run's trajectory: ``atif`` (the Agent Trajectory Interchange Format, one JSON
        document) or ``jsonl`` (its journal records, one a line); secret values masked."""
        chosen = _format(format, RunExportFormat)
        page = await cp.export_run(project_of(project), name, chosen)
        return Response(content=page.data, media_type=page.media_type, headers=_attachment(name, chosen))

    @app.get(
        "/v1/projects/{project}/agentgroups/{name}/export",
        response_class=StreamingResponse,
        responses={200: {"description": "the evaluation's cases", "content": _CONTENT}},
    )
    async def export_evaluation(project: str, name: str, format: str | None = None) -> StreamingResponse:
        """An evaluation's cases: ``parquet`` (one row per case), ``jsonl`` (one case a line) or
        ``inspect`` (Inspect's eval log, JSON, for ``inspect view``); secret values masked."""
        chosen = _format(format, EvaluationExportFormat)
        checked = project_of(project)
        first = await cp.export_evaluation(checked, name, chosen, 0)

        async def pages() -> AsyncIterator[bytes]:
            page: Any = first
            while True:
                yield page.data
                if page.next_page is None:
                    return
                page = await cp.export_evaluation(checked, name, chosen, page.next_page)

        return StreamingResponse(pages(), media_type=first.media_type, headers=_attachment(name, chosen))
