"""Exports from Python: a run's trajectory (`Client.export_run`) and an evaluation's cases
(`Client.export_evaluation`), as bytes or streamed to a file.

A mixin of `client.Client`. The format is checked here first (`nodus.export_formats`, the list
the server offers), so one not offered raises `errors.Invalid` naming ``format`` before anything
is sent. Written to a file, an export is streamed (an evaluation of thousands of cases is never
whole in memory) into ``<file>.part`` and renamed over ``<file>`` once complete, so a failed
export leaves no half file behind.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ._client_core import ClientCore
from .errors import Invalid, error_from_response
from .export_formats import evaluation_export_format, run_export_format

if TYPE_CHECKING:
    import httpx

__all__ = ["ExportCalls"]

Target = str | os.PathLike[str] | IO[bytes]


class ExportCalls(ClientCore):
    """`Client`'s exports."""

    def export_run(
        self, name: str, format: str = "atif", *, to: Target | None = None, project: str | None = None
    ) -> bytes | int:
        """The run's trajectory, ``atif`` or ``jsonl``: its bytes, or with ``to`` (a path or a
        binary file) the number of bytes written there."""
        chosen = run_export_format(format).value
        return self._export(self._path("agentruns", project, name, "export"), chosen, to)

    def export_evaluation(
        self, name: str, format: str = "inspect", *, to: Target | None = None, project: str | None = None
    ) -> bytes | int:
        """An evaluation group's cases, ``parquet``, ``jsonl`` or ``inspect`` (Inspect's eval log):
        its bytes, or with ``to`` (a path or a binary file) the number of bytes written there."""
        chosen = evaluation_export_format(format).value
        return self._export(self._path("agentgroups", project, name, "export"), chosen, to)

    def _export(self, path: str, format: str, to: Target | None) -> bytes | int:
        params = {"format": format}
        if to is None:
            return self._request("GET", path, params=params).content
        with self._http.stream("GET", path, params=params) as response:
            if not response.is_success:
                response.read()
                try:
                    body = response.json()
                except ValueError:
                    body = None
                raise error_from_response(response.status_code, body)
            if not isinstance(to, str | os.PathLike):
                return _copy(response, to)
            target = Path(to)
            partial = target.with_name(target.name + ".part")
            try:
                with partial.open("wb") as out:
                    written = _copy(response, out)
                partial.replace(target)
            except OSError as exc:
                partial.unlink(missing_ok=True)
                raise Invalid(
                    f"cannot write {target}: {exc.strerror or exc}",
                    details={"field": "to", "path": str(target)},
                ) from None
            return written


def _copy(response: httpx.Response, out: IO[bytes]) -> int:
    written = 0
    for chunk in response.iter_bytes():
        out.write(chunk)
        written += len(chunk)
    return written
