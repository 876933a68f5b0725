"""What each kind of storage object holds and who writes it: `LAYOUT`, the table of
`nodus_ray.store.layout`'s keys.

Kept apart from the key builders: every module that reads or writes storage imports
`layout`, while only the docs' table (`layout_table`, pasted into ``docs/architecture.md``) and
the test that checks both against each other need the descriptions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nodus_ray.store.layout import (
    agent_document,
    agent_revision,
    agent_source,
    batch_record,
    budget,
    budget_spend,
    command_egress,
    credits,
    evaluation_case,
    evaluation_results,
    group_document,
    journal_chunk,
    journal_generation_segment,
    journal_segment,
    journal_skeleton,
    message,
    operator_token,
    program_log,
    run_agent,
    run_answer,
    run_document,
    run_epoch,
    run_generation,
    run_output,
    run_result,
    secret,
    seed,
    server_model_key,
    token,
    webhook_delivery,
    webhook_document,
    workspace_blob,
    workspace_manifest,
    workspace_snapshot,
)

__all__ = ["Key", "LAYOUT", "layout_table"]


@dataclass(frozen=True)
class Key:
    """One kind of object in storage: its key pattern (a `str.format` pattern over the
    function's values), what it holds, who writes it, and the function that builds it."""

    pattern: str
    holds: str
    written_by: str
    function: Callable[..., str]


_RUN = "projects/{project}/agentruns/{name}"
_GROUP = "projects/{project}/agentgroups/{name}"

LAYOUT: tuple[Key, ...] = (
    Key(
        "projects/{project}/agents/{name}/agent.json",
        "the current Agent (with status.revision)",
        "control plane (agents)",
        agent_document,
    ),
    Key(
        "projects/{project}/agents/{name}/revisions/{rev:06d}.json",
        "every accepted revision of the Agent",
        "control plane (agents)",
        agent_revision,
    ),
    Key(f"{_RUN}/run.json", "the AgentRun with its status", "control plane (runs)", run_document),
    Key(f"{_RUN}/agent.json", "the Agent revision the run pinned", "control plane (runs)", run_agent),
    Key(
        f"{_RUN}/journal/{{seq:012d}}.arrow",
        "one journal record per segment",
        "run actor; control plane (resolution)",
        journal_segment,
    ),
    Key(
        f"{_RUN}/journal/{{first:012d}}-{{last:012d}}.arrow",
        "journal records first..last, merged by compaction",
        "run actor",
        journal_chunk,
    ),
    Key(
        f"{_RUN}/journal/{{first:012d}}-{{last:012d}}.skeleton.arrow",
        "a finished run's records without their payloads, after its payload retention",
        "control plane (retention)",
        journal_skeleton,
    ),
    Key(
        f"{_RUN}/journal-g{{generation:06d}}/{{seq:012d}}.arrow",
        "the journal of generation {generation} >= 1 (continue_as_new); older ones are deleted",
        "run actor",
        journal_generation_segment,
    ),
    Key(
        f"{_RUN}/generations/{{generation:06d}}.json",
        "generation {generation}'s input and first journal seq",
        "control plane (generations)",
        run_generation,
    ),
    Key(f"{_RUN}/answer.txt", "the full answer", "run actor", run_answer),
    Key(f"{_RUN}/messages/{{seq:08d}}.json", "a keep-alive run's inbox", "control plane (messages)", message),
    Key(
        f"{_RUN}/workspace/{{seq:012d}}.manifest.json",
        "the workspace after command {seq}: its dirs, files (sha256) and symlinks; every command's is kept (forks)",
        "run actor (workspace snapshots)",
        workspace_manifest,
    ),
    Key(
        f"{_RUN}/workspace/blobs/{{digest}}",
        "a file content of the kept manifests (zlib), stored once by its sha256",
        "run actor (workspace snapshots)",
        workspace_blob,
    ),
    Key(
        f"{_RUN}/workspace/{{seq:012d}}.tar.gz",
        "the whole workspace after command {seq}, as written before manifests (still read)",
        "run actor (before manifests)",
        workspace_snapshot,
    ),
    Key(
        f"{_RUN}/seed.tar.gz",
        "an evaluation task's files: the run's first workspace",
        "control plane (evaluations)",
        seed,
    ),
    Key(
        f"{_RUN}/epochs/{{attempt:09d}}",
        "the claim of the actor serving that attempt (fencing)",
        "run actor",
        run_epoch,
    ),
    Key(
        f"{_RUN}/egress/{{seq:012d}}.json",
        "the connections of the command started at {seq} (host, port, outcome, bytes), as they happen",
        "run actor (egress proxy)",
        command_egress,
    ),
    Key(f"{_RUN}/result.json", "a Python program's return value (JSON)", "run actor", run_result),
    Key(f"{_RUN}/outputs/{{output}}", "an output the program saved, byte for byte", "run actor", run_output),
    Key(
        f"{_RUN}/logs/{{attempt:09d}}.txt",
        "what the program printed in that attempt (replays not repeated)",
        "run actor",
        program_log,
    ),
    Key(
        "projects/{project}/sources/{digest}.json",
        "an Agent's source files, content-addressed (SHA-256)",
        "control plane (agents)",
        agent_source,
    ),
    Key(f"{_GROUP}/group.json", "an AgentGroup: spec, last status", "control plane (groups)", group_document),
    Key(
        f"{_GROUP}/evaluation/cases/{{run}}.json",
        "an evaluation case's final record",
        "control plane (evaluations)",
        evaluation_case,
    ),
    Key(
        f"{_GROUP}/evaluation/results.parquet",
        "every case's final record, one row each",
        "control plane (evaluations)",
        evaluation_results,
    ),
    Key(
        "projects/{project}/batches/{id}.json",
        "a batch record (Pending, or Done with its answer)",
        "control plane (batches)",
        batch_record,
    ),
    Key(
        "projects/{project}/secrets/{name}.json",
        "a Secret: its keys, and its values sealed",
        "control plane (secrets)",
        secret,
    ),
    Key(
        "projects/{project}/tokens/{name}.json",
        "a project token: its role and the SHA-256 of its value",
        "control plane (tokens)",
        token,
    ),
    Key(
        "projects/{project}/credits.json",
        "credits granted, spend of deleted runs",
        "control plane (credits)",
        credits,
    ),
    Key(
        "projects/{project}/budgets/{name}.json",
        "the project's Budget (one per project), as applied",
        "control plane (budgets)",
        budget,
    ),
    Key(
        "projects/{project}/budget-spend.json",
        "the Budget's period baseline, spend of deleted runs and groups",
        "control plane (budgets)",
        budget_spend,
    ),
    Key(
        "projects/{project}/webhooks/{name}/webhook.json",
        "a Webhook: URL, events, group, the Secret key that signs (never the key)",
        "control plane (webhooks)",
        webhook_document,
    ),
    Key(
        "projects/{project}/webhooks/{name}/deliveries/{id}.json",
        "one event for the Webhook: its body, state, next attempt and every attempt",
        "control plane (webhooks)",
        webhook_delivery,
    ),
    Key(
        "system/tokens/{name}.json",
        "an operator token (admin in every project), hashed",
        "control plane (tokens), at `nodus up`",
        operator_token,
    ),
    Key(
        "system/anthropic-key.json",
        "the server's Anthropic key, sealed",
        "control plane (secrets), at `nodus up`",
        server_model_key,
    ),
)


def layout_table() -> str:
    """`LAYOUT` as the Markdown table ``docs/architecture.md`` shows (a test checks they agree)."""
    rows = ["| Key | What it holds | Written by |", "| --- | --- | --- |"]
    rows += [f"| `{key.pattern}` | {key.holds} | {key.written_by} |" for key in LAYOUT]
    return "\n".join(rows) + "\n"
