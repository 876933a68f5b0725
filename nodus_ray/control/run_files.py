"""What a Python run leaves beside its journal: named outputs and the program's log.

The run actor writes them (`layout.run_output`, `layout.program_log`); this module only reads
them for the API (``GET agentruns/{name}/outputs[/{output}]``, ``GET agentruns/{name}/logs``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from nodus.errors import Invalid, NotFound
from nodus_ray.control.registry import Registry
from nodus_ray.control.retention_policy import check_payloads
from nodus_ray.store import layout

__all__ = ["RunFiles"]

_MAX_OUTPUT_NAME = 128


def _check_output_name(output: str) -> str:
    """An output's name is one path segment: it cannot reach outside the run's outputs."""
    if (
        not output
        or len(output) > _MAX_OUTPUT_NAME
        or "/" in output
        or output in (".", "..")
        or (output.startswith("."))
    ):
        raise Invalid(
            f"output {output[:40]!r} is not an output name (one segment, not starting with a dot)",
            details={"field": "output"},
        )
    return output


class RunFiles:
    """Reads of a run's outputs and program log; a missing run or output is NotFound."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    async def run_outputs(self, project: str, name: str) -> list[dict[str, Any]]:
        """``[{"name", "bytes"}]`` of the outputs the run saved, by name."""
        check_payloads(self._registry.run(project, name), "outputs")
        storage = self._registry.storage

        def listing() -> list[dict[str, Any]]:
            names = storage.list_dir(layout.outputs_folder(project, name))
            # Sizes by reading: outputs are workspace files a program saved, and the store has
            # no size query; a listing is rare next to a run's steps.
            return [
                {"name": output, "bytes": len(storage.read_bytes(layout.run_output(project, name, output)))}
                for output in names
            ]

        return await asyncio.to_thread(listing)

    async def run_output(self, project: str, name: str, output: str) -> bytes:
        """One output, byte for byte; NotFound naming it (and the ones there are) when missing."""
        check_payloads(self._registry.run(project, name), "outputs")
        _check_output_name(output)
        storage = self._registry.storage
        try:
            return await asyncio.to_thread(storage.read_bytes, layout.run_output(project, name, output))
        except FileNotFoundError:
            saved = await asyncio.to_thread(storage.list_dir, layout.outputs_folder(project, name))
            raise NotFound(
                f"agentrun {name!r} has no output {output!r}"
                + (f" (it has {', '.join(saved[:10])})" if saved else " (it saved none)"),
                details={"kind": "AgentRun", "name": name, "output": output},
            ) from None

    async def run_logs(self, project: str, name: str) -> str:
        """What the program printed, every attempt in order (a replay's output was not kept)."""
        check_payloads(self._registry.run(project, name), "program log")
        storage = self._registry.storage

        def read() -> str:
            folder = layout.logs_folder(project, name)
            parts = []
            for entry in storage.list_dir(folder):
                if entry.endswith(".txt"):
                    parts.append(storage.read_bytes(f"{folder}/{entry}").decode("utf-8", "replace"))
            return "".join(parts)

        return await asyncio.to_thread(read)
