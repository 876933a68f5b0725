"""The storage layout: every key pinned byte for byte, and the docs' table checked against it.

The pins are written out by hand, not derived from `layout`: storage written by an earlier
version must still be read, so a key may only change on purpose, with this file.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest

from nodus_ray.store import layout, layout_table

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"

RUN = "projects/p/agentruns/n"
GROUP = "projects/p/agentgroups/n"

# (the call, the key it must build)
PINNED: dict[str, tuple[Callable[[], str], str]] = {
    "projects_folder": (lambda: layout.projects_folder(), "projects"),
    "agents_folder": (lambda: layout.agents_folder("p"), "projects/p/agents"),
    "agent_prefix": (lambda: layout.agent_prefix("p", "n"), "projects/p/agents/n"),
    "agent_document": (lambda: layout.agent_document("p", "n"), "projects/p/agents/n/agent.json"),
    "agent_revision": (
        lambda: layout.agent_revision("p", "n", 3),
        "projects/p/agents/n/revisions/000003.json",
    ),
    "runs_folder": (lambda: layout.runs_folder("p"), "projects/p/agentruns"),
    "run_prefix": (lambda: layout.run_prefix("p", "n"), RUN),
    "run_document": (lambda: layout.run_document("p", "n"), f"{RUN}/run.json"),
    "run_agent": (lambda: layout.run_agent("p", "n"), f"{RUN}/agent.json"),
    "run_answer": (lambda: layout.run_answer("p", "n"), f"{RUN}/answer.txt"),
    "journal_folder": (lambda: layout.journal_folder("p", "n"), f"{RUN}/journal"),
    "journal_segment": (
        lambda: layout.journal_segment(f"{RUN}/journal", 7),
        f"{RUN}/journal/000000000007.arrow",
    ),
    "journal_chunk": (
        lambda: layout.journal_chunk(f"{RUN}/journal", 0, 7),
        f"{RUN}/journal/000000000000-000000000007.arrow",
    ),
    "journal_skeleton": (
        lambda: layout.journal_skeleton(f"{RUN}/journal", 0, 7),
        f"{RUN}/journal/000000000000-000000000007.skeleton.arrow",
    ),
    "journal_generation_folder": (
        lambda: layout.journal_generation_folder("p", "n", 7),
        f"{RUN}/journal-g000007",
    ),
    "journal_generation_segment": (
        lambda: layout.journal_generation_segment("p", "n", 7, 7),
        f"{RUN}/journal-g000007/000000000007.arrow",
    ),
    "run_generation": (lambda: layout.run_generation("p", "n", 7), f"{RUN}/generations/000007.json"),
    "messages_folder": (lambda: layout.messages_folder("p", "n"), f"{RUN}/messages"),
    "message": (lambda: layout.message("p", "n", 7), f"{RUN}/messages/00000007.json"),
    "workspace_folder": (lambda: layout.workspace_folder(RUN), f"{RUN}/workspace"),
    "workspace_manifest": (
        lambda: layout.workspace_manifest(RUN, 7),
        f"{RUN}/workspace/000000000007.manifest.json",
    ),
    "workspace_blobs_folder": (lambda: layout.workspace_blobs_folder(RUN), f"{RUN}/workspace/blobs"),
    "workspace_blob": (lambda: layout.workspace_blob(RUN, "ab12"), f"{RUN}/workspace/blobs/ab12"),
    "workspace_snapshot": (
        lambda: layout.workspace_snapshot(RUN, 7),
        f"{RUN}/workspace/000000000007.tar.gz",
    ),
    "seed": (lambda: layout.seed(RUN), f"{RUN}/seed.tar.gz"),
    "epochs_folder": (lambda: layout.epochs_folder(RUN), f"{RUN}/epochs"),
    "run_epoch": (lambda: layout.run_epoch(RUN, 7), f"{RUN}/epochs/000000007"),
    "egress_folder": (lambda: layout.egress_folder(RUN), f"{RUN}/egress"),
    "command_egress": (lambda: layout.command_egress(RUN, 7), f"{RUN}/egress/000000000007.json"),
    "run_result": (lambda: layout.run_result("p", "n"), f"{RUN}/result.json"),
    "outputs_folder": (lambda: layout.outputs_folder("p", "n"), f"{RUN}/outputs"),
    "run_output": (lambda: layout.run_output("p", "n", "report"), f"{RUN}/outputs/report"),
    "logs_folder": (lambda: layout.logs_folder("p", "n"), f"{RUN}/logs"),
    "program_log": (lambda: layout.program_log("p", "n", 7), f"{RUN}/logs/000000007.txt"),
    "sources_folder": (lambda: layout.sources_folder("p"), "projects/p/sources"),
    "agent_source": (lambda: layout.agent_source("p", "ab12"), "projects/p/sources/ab12.json"),
    "groups_folder": (lambda: layout.groups_folder("p"), "projects/p/agentgroups"),
    "group_prefix": (lambda: layout.group_prefix("p", "n"), GROUP),
    "group_document": (lambda: layout.group_document("p", "n"), f"{GROUP}/group.json"),
    "evaluation_prefix": (lambda: layout.evaluation_prefix("p", "n"), f"{GROUP}/evaluation"),
    "evaluation_cases_folder": (
        lambda: layout.evaluation_cases_folder("p", "n"),
        f"{GROUP}/evaluation/cases",
    ),
    "evaluation_case": (
        lambda: layout.evaluation_case("p", "n", "r"),
        f"{GROUP}/evaluation/cases/r.json",
    ),
    "evaluation_results": (
        lambda: layout.evaluation_results("p", "n"),
        f"{GROUP}/evaluation/results.parquet",
    ),
    "batches_folder": (lambda: layout.batches_folder("p"), "projects/p/batches"),
    "batch_record": (lambda: layout.batch_record("p", "b1"), "projects/p/batches/b1.json"),
    "secrets_folder": (lambda: layout.secrets_folder("p"), "projects/p/secrets"),
    "secret": (lambda: layout.secret("p", "n"), "projects/p/secrets/n.json"),
    "tokens_folder": (lambda: layout.tokens_folder("p"), "projects/p/tokens"),
    "token": (lambda: layout.token("p", "n"), "projects/p/tokens/n.json"),
    "operator_tokens_folder": (lambda: layout.operator_tokens_folder(), "system/tokens"),
    "operator_token": (lambda: layout.operator_token("n"), "system/tokens/n.json"),
    "credits": (lambda: layout.credits("p"), "projects/p/credits.json"),
    "budgets_folder": (lambda: layout.budgets_folder("p"), "projects/p/budgets"),
    "budget": (lambda: layout.budget("p", "n"), "projects/p/budgets/n.json"),
    "budget_spend": (lambda: layout.budget_spend("p"), "projects/p/budget-spend.json"),
    "webhooks_folder": (lambda: layout.webhooks_folder("p"), "projects/p/webhooks"),
    "webhook_prefix": (lambda: layout.webhook_prefix("p", "n"), "projects/p/webhooks/n"),
    "webhook_document": (lambda: layout.webhook_document("p", "n"), "projects/p/webhooks/n/webhook.json"),
    "webhook_deliveries_folder": (
        lambda: layout.webhook_deliveries_folder("p", "n"),
        "projects/p/webhooks/n/deliveries",
    ),
    "webhook_delivery": (
        lambda: layout.webhook_delivery("p", "n", "b1"),
        "projects/p/webhooks/n/deliveries/b1.json",
    ),
    "server_model_key": (lambda: layout.server_model_key(), "system/anthropic-key.json"),
}

# The values the samples above use, by the names the `LAYOUT` patterns give them.
VALUES = {
    "project": "p",
    "name": "n",
    "rev": 3,
    "seq": 7,
    "first": 0,
    "last": 7,
    "run": "r",
    "id": "b1",
    "attempt": 7,
    "output": "report",
    "digest": "ab12",
    "generation": 7,
}


def _key_functions() -> set[str]:
    return set(layout.__all__)


@pytest.mark.parametrize("function", sorted(PINNED))
def test_each_key_is_pinned(function: str) -> None:
    call, expected = PINNED[function]
    assert call() == expected


def test_every_key_function_is_pinned() -> None:
    assert set(PINNED) == _key_functions()
    for name in _key_functions():
        assert inspect.isfunction(getattr(layout, name)), name


def test_every_object_is_in_the_layout_and_its_pattern_is_what_the_function_builds() -> None:
    in_layout = {key.function.__name__ for key in layout_table.LAYOUT}
    folders = {name for name in _key_functions() if name.endswith(("_folder", "_prefix"))}
    # A key function that names an object (not a folder) must have its line in the table.
    assert _key_functions() - folders == in_layout
    patterns = [key.pattern.format(**VALUES) for key in layout_table.LAYOUT]
    for key, formatted in zip(layout_table.LAYOUT, patterns, strict=True):
        assert formatted == PINNED[key.function.__name__][1], key.pattern
    # A folder holds objects of the table.
    for name in folders:
        folder = PINNED[name][1]
        assert any(pattern.startswith(f"{folder}/") for pattern in patterns), name


def test_the_module_docstring_lists_the_layout() -> None:
    listed = [
        tuple(line.split())
        for line in (layout.__doc__ or "").splitlines()
        if line.startswith(("    projects/", "    system/"))
    ]
    assert listed == [(key.pattern, key.function.__name__) for key in layout_table.LAYOUT]


def _docs_table() -> str:
    """The Markdown table under the docs' "Storage layout" heading."""
    section = ARCHITECTURE.read_text().split("\n## Storage layout\n", 1)[1].split("\n## ", 1)[0]
    return "".join(f"{line}\n" for line in section.splitlines() if line.startswith("|"))


def test_the_docs_table_is_the_layout() -> None:
    # On a failure: paste `layout_table.layout_table()` into docs/architecture.md, "Storage layout".
    assert _docs_table() == layout_table.layout_table()
