"""Every storage key the service reads or writes, built in one place.

Storage (`nodus_ray.store.storage.Storage`) is the service's only durable state, so the shape
of storage is part of its contract: a cluster restarted on a newer version reads what the older
one wrote. The keys are therefore built here and nowhere else, byte for byte as they always
were, and `LAYOUT` lists each kind of object with what it holds and who writes it.
``docs/architecture.md`` shows `layout_table` of it (both in `nodus_ray.store.layout_table`, which
describes these keys; this module only builds them), and a unit test fails when the two differ,
so a key cannot be added without its line in the docs.

Each kind of object, and the function that builds its key (`LAYOUT` says more of each; a
test checks this list against it)::

    projects/{project}/agents/{name}/agent.json                               agent_document
    projects/{project}/agents/{name}/revisions/{rev:06d}.json                 agent_revision
    projects/{project}/agentruns/{name}/run.json                              run_document
    projects/{project}/agentruns/{name}/agent.json                            run_agent
    projects/{project}/agentruns/{name}/journal/{seq:012d}.arrow              journal_segment
    projects/{project}/agentruns/{name}/journal/{first:012d}-{last:012d}.arrow  journal_chunk
    projects/{project}/agentruns/{name}/journal/{first:012d}-{last:012d}.skeleton.arrow  journal_skeleton
    projects/{project}/agentruns/{name}/journal-g{generation:06d}/{seq:012d}.arrow  journal_generation_segment
    projects/{project}/agentruns/{name}/generations/{generation:06d}.json     run_generation
    projects/{project}/agentruns/{name}/answer.txt                            run_answer
    projects/{project}/agentruns/{name}/messages/{seq:08d}.json               message
    projects/{project}/agentruns/{name}/workspace/{seq:012d}.manifest.json    workspace_manifest
    projects/{project}/agentruns/{name}/workspace/blobs/{digest}              workspace_blob
    projects/{project}/agentruns/{name}/workspace/{seq:012d}.tar.gz           workspace_snapshot
    projects/{project}/agentruns/{name}/seed.tar.gz                           seed
    projects/{project}/agentruns/{name}/epochs/{attempt:09d}                  run_epoch
    projects/{project}/agentruns/{name}/egress/{seq:012d}.json                command_egress
    projects/{project}/agentruns/{name}/result.json                           run_result
    projects/{project}/agentruns/{name}/outputs/{output}                      run_output
    projects/{project}/agentruns/{name}/logs/{attempt:09d}.txt                program_log
    projects/{project}/sources/{digest}.json                                  agent_source
    projects/{project}/agentgroups/{name}/group.json                          group_document
    projects/{project}/agentgroups/{name}/evaluation/cases/{run}.json         evaluation_case
    projects/{project}/agentgroups/{name}/evaluation/results.parquet          evaluation_results
    projects/{project}/batches/{id}.json                                      batch_record
    projects/{project}/secrets/{name}.json                                    secret
    projects/{project}/tokens/{name}.json                                     token
    projects/{project}/credits.json                                           credits
    projects/{project}/budgets/{name}.json                                    budget
    projects/{project}/budget-spend.json                                      budget_spend
    projects/{project}/webhooks/{name}/webhook.json                           webhook_document
    projects/{project}/webhooks/{name}/deliveries/{id}.json                   webhook_delivery
    system/tokens/{name}.json                                                 operator_token
    system/anthropic-key.json                                                 server_model_key

The ``*_folder`` and ``*_prefix`` functions name the folders above (to list or delete a tree).
Functions that take a ``prefix`` take what `run_prefix` (or `journal_folder`) returned: the
journal, the workspace snapshots and the seed are addressed by the code that holds only a run's
prefix (a `Journal`, `WorkspaceSnapshots`, the grader).

Pure: string formatting only, no I/O, no Ray.
"""

from __future__ import annotations

__all__ = [
    "projects_folder",
    "agents_folder",
    "agent_prefix",
    "agent_document",
    "agent_revision",
    "runs_folder",
    "run_prefix",
    "run_document",
    "run_agent",
    "run_answer",
    "journal_folder",
    "journal_segment",
    "journal_chunk",
    "journal_skeleton",
    "journal_generation_folder",
    "journal_generation_segment",
    "run_generation",
    "messages_folder",
    "message",
    "workspace_folder",
    "workspace_manifest",
    "workspace_blobs_folder",
    "workspace_blob",
    "workspace_snapshot",
    "seed",
    "epochs_folder",
    "run_epoch",
    "egress_folder",
    "command_egress",
    "run_result",
    "outputs_folder",
    "run_output",
    "logs_folder",
    "program_log",
    "sources_folder",
    "agent_source",
    "groups_folder",
    "group_prefix",
    "group_document",
    "evaluation_prefix",
    "evaluation_cases_folder",
    "evaluation_case",
    "evaluation_results",
    "batches_folder",
    "batch_record",
    "secrets_folder",
    "secret",
    "tokens_folder",
    "token",
    "operator_tokens_folder",
    "operator_token",
    "credits",
    "budgets_folder",
    "budget",
    "budget_spend",
    "webhooks_folder",
    "webhook_prefix",
    "webhook_document",
    "webhook_deliveries_folder",
    "webhook_delivery",
    "server_model_key",
]

_PROJECTS = "projects"
_SYSTEM = "system"
_GENERATION_DIGITS = 6  # a Python run's journal generations: ``journal-g{n:06d}``
_JOURNAL_DIGITS = 12  # journal segments and chunks: ``{seq:012d}.arrow``, ``{a:012d}-{b:012d}.arrow``
_WORKSPACE_DIGITS = 12  # workspace snapshots: ``{seq:012d}.manifest.json`` (``.tar.gz`` before)
_EPOCH_DIGITS = 9  # run epochs: ``{attempt:09d}``
_MESSAGE_DIGITS = 8  # a keep-alive run's inbox: ``{seq:08d}.json``
_REVISION_DIGITS = 6  # an agent's revisions: ``{rev:06d}.json``


# -- projects and agents ---------------------------------------------------------------------


def projects_folder() -> str:
    """The folder of every project (listed at startup to reload them)."""
    return _PROJECTS


def agents_folder(project: str) -> str:
    return f"{_PROJECTS}/{project}/agents"


def agent_prefix(project: str, name: str) -> str:
    return f"{agents_folder(project)}/{name}"


def agent_document(project: str, name: str) -> str:
    """The current Agent, with ``status.revision``."""
    return f"{agent_prefix(project, name)}/agent.json"


def agent_revision(project: str, name: str, revision: int) -> str:
    """One accepted revision of an Agent (a run pins one; an evaluation reads it back)."""
    return f"{agent_prefix(project, name)}/revisions/{revision:0{_REVISION_DIGITS}d}.json"


# -- runs ------------------------------------------------------------------------------------


def runs_folder(project: str) -> str:
    return f"{_PROJECTS}/{project}/agentruns"


def run_prefix(project: str, name: str) -> str:
    """Everything of one run lives under this prefix; deleting the run deletes the tree."""
    return f"{runs_folder(project)}/{name}"


def run_document(project: str, name: str) -> str:
    """The AgentRun with its status."""
    return f"{run_prefix(project, name)}/run.json"


def run_agent(project: str, name: str) -> str:
    """The Agent revision the run pinned when it was created."""
    return f"{run_prefix(project, name)}/agent.json"


def run_answer(project: str, name: str) -> str:
    """The run's full answer (its status holds only a preview)."""
    return f"{run_prefix(project, name)}/answer.txt"


def journal_folder(project: str, name: str) -> str:
    """The run's journal: the prefix a `Journal` is opened on."""
    return f"{run_prefix(project, name)}/journal"


def journal_segment(prefix: str, seq: int) -> str:
    """One journal record, written once (``prefix`` is the journal's, e.g. `journal_folder`)."""
    return f"{prefix}/{seq:0{_JOURNAL_DIGITS}d}.arrow"


def journal_chunk(prefix: str, first: int, last: int) -> str:
    """The records ``first``..``last`` of a journal, merged by compaction."""
    return f"{prefix}/{first:0{_JOURNAL_DIGITS}d}-{last:0{_JOURNAL_DIGITS}d}.arrow"


def journal_skeleton(prefix: str, first: int, last: int) -> str:
    """A finished run's records ``first``..``last`` without their payloads (retention,
    `durable.skeleton`): written once, preferred by readers over the objects it replaces."""
    return f"{prefix}/{first:0{_JOURNAL_DIGITS}d}-{last:0{_JOURNAL_DIGITS}d}.skeleton.arrow"


def journal_generation_folder(project: str, name: str, generation: int) -> str:
    """The journal of a run's ``generation`` (``continue_as_new`` starts the next one): a
    `Journal` prefix; generation 0 is `journal_folder`, so runs that never continue keep it."""
    if generation <= 0:
        return journal_folder(project, name)
    return f"{run_prefix(project, name)}/journal-g{generation:0{_GENERATION_DIGITS}d}"


def journal_generation_segment(project: str, name: str, generation: int, seq: int) -> str:
    """One record of a generation's journal (its chunks sit beside it, as in `journal_folder`)."""
    return journal_segment(journal_generation_folder(project, name, generation), seq)


def run_generation(project: str, name: str, generation: int) -> str:
    """What a generation >= 1 of a run starts with: its input and its journal's first seq,
    written before ``status.generation`` names it (so a crash never loses the new input)."""
    return f"{run_prefix(project, name)}/generations/{generation:0{_GENERATION_DIGITS}d}.json"


def messages_folder(project: str, name: str) -> str:
    return f"{run_prefix(project, name)}/messages"


def message(project: str, name: str, seq: int) -> str:
    """One message to a keep-alive run, in the order it was accepted."""
    return f"{messages_folder(project, name)}/{seq:0{_MESSAGE_DIGITS}d}.json"


def workspace_folder(prefix: str) -> str:
    """The run's workspace snapshots (``prefix`` is the run's, from `run_prefix`)."""
    return f"{prefix}/workspace"


def workspace_manifest(prefix: str, seq: int) -> str:
    """The run's workspace as it was after command ``seq``: its entries, files by sha256."""
    return f"{workspace_folder(prefix)}/{seq:0{_WORKSPACE_DIGITS}d}.manifest.json"


def workspace_blobs_folder(prefix: str) -> str:
    """The contents of the files the run's workspace manifests list, each stored once."""
    return f"{workspace_folder(prefix)}/blobs"


def workspace_blob(prefix: str, digest: str) -> str:
    """One file content of the run's workspace, by its sha256 (hex)."""
    return f"{workspace_blobs_folder(prefix)}/{digest}"


def workspace_snapshot(prefix: str, seq: int) -> str:
    """The run's workspace as it was after command ``seq``, as a whole tar.gz: what was written
    before manifests (`workspace_manifest`); still read, no longer written."""
    return f"{workspace_folder(prefix)}/{seq:0{_WORKSPACE_DIGITS}d}.tar.gz"


def seed(prefix: str) -> str:
    """A seeded run's first workspace (an evaluation task's files, a tar.gz)."""
    return f"{prefix}/seed.tar.gz"


def epochs_folder(prefix: str) -> str:
    """The epochs actors of the run claimed (``prefix`` is the run's, from `run_prefix`)."""
    return f"{prefix}/epochs"


def run_epoch(prefix: str, attempt: int) -> str:
    """The claim of the actor serving ``attempt``, created once (see `durable.fencing`)."""
    return f"{epochs_folder(prefix)}/{attempt:0{_EPOCH_DIGITS}d}"


def egress_folder(prefix: str) -> str:
    """The connection records of the run's commands (``prefix`` is the run's, from `run_prefix`)."""
    return f"{prefix}/egress"


def command_egress(prefix: str, seq: int) -> str:
    """The connections of the command started at journal ``seq``, written as they happen: the
    evidence a person reads when that command was interrupted (`egress.run_egress`)."""
    return f"{egress_folder(prefix)}/{seq:0{_JOURNAL_DIGITS}d}.json"


# -- groups and evaluations ------------------------------------------------------------------


def groups_folder(project: str) -> str:
    return f"{_PROJECTS}/{project}/agentgroups"


def group_prefix(project: str, name: str) -> str:
    """Everything of one group lives under this prefix; deleting the group deletes the tree."""
    return f"{groups_folder(project)}/{name}"


def group_document(project: str, name: str) -> str:
    """The AgentGroup: its spec and last status."""
    return f"{group_prefix(project, name)}/group.json"


def evaluation_prefix(project: str, name: str) -> str:
    """An evaluation group's results."""
    return f"{group_prefix(project, name)}/evaluation"


def evaluation_cases_folder(project: str, name: str) -> str:
    return f"{evaluation_prefix(project, name)}/cases"


def evaluation_case(project: str, name: str, run: str) -> str:
    """The final record of one case (the case's run is ``run``)."""
    return f"{evaluation_cases_folder(project, name)}/{run}.json"


def evaluation_results(project: str, name: str) -> str:
    """Every case's final record, one row each (rewritten as cases finish)."""
    return f"{evaluation_prefix(project, name)}/results.parquet"


# -- batches, secrets, tokens, credits -------------------------------------------------------


def batches_folder(project: str) -> str:
    return f"{_PROJECTS}/{project}/batches"


def batch_record(project: str, record_id: str) -> str:
    """A batch record: Pending before any of its runs is written, then Done with its answer."""
    return f"{batches_folder(project)}/{record_id}.json"


def secrets_folder(project: str) -> str:
    return f"{_PROJECTS}/{project}/secrets"


def secret(project: str, name: str) -> str:
    """A Secret: its keys in the clear, its values sealed."""
    return f"{secrets_folder(project)}/{name}.json"


def tokens_folder(project: str) -> str:
    return f"{_PROJECTS}/{project}/tokens"


def token(project: str, name: str) -> str:
    """A project token: its role and the SHA-256 of its value, never the value."""
    return f"{tokens_folder(project)}/{name}.json"


def operator_tokens_folder() -> str:
    return f"{_SYSTEM}/tokens"


def operator_token(name: str) -> str:
    """An operator token (admin in every project), stored as a project token is."""
    return f"{operator_tokens_folder()}/{name}.json"


def credits(project: str) -> str:
    """A project's credits: what was granted, and what its deleted runs had spent."""
    return f"{_PROJECTS}/{project}/credits.json"


def budgets_folder(project: str) -> str:
    return f"{_PROJECTS}/{project}/budgets"


def budget(project: str, name: str) -> str:
    """A project's Budget (one per project): its spec, as applied."""
    return f"{budgets_folder(project)}/{name}.json"


def budget_spend(project: str) -> str:
    """What a project's Budget cannot derive: deleted runs' spend, the period's baseline."""
    return f"{_PROJECTS}/{project}/budget-spend.json"


def webhooks_folder(project: str) -> str:
    return f"{_PROJECTS}/{project}/webhooks"


def webhook_prefix(project: str, name: str) -> str:
    return f"{webhooks_folder(project)}/{name}"


def webhook_document(project: str, name: str) -> str:
    """A Webhook: its spec, as applied (the signing secret is a Secret's, never here)."""
    return f"{webhook_prefix(project, name)}/webhook.json"


def webhook_deliveries_folder(project: str, name: str) -> str:
    return f"{webhook_prefix(project, name)}/deliveries"


def webhook_delivery(project: str, name: str, delivery: str) -> str:
    """One event for the Webhook: its body, state and every attempt (``{ms:013d}-{event id}``)."""
    return f"{webhook_deliveries_folder(project, name)}/{delivery}.json"


def server_model_key() -> str:
    """The server's own Anthropic key, sealed."""
    return f"{_SYSTEM}/anthropic-key.json"


def run_result(project: str, name: str) -> str:
    """A Python program's return value, as JSON (its parent's ``gather`` reads it)."""
    return f"{run_prefix(project, name)}/result.json"


def outputs_folder(project: str, name: str) -> str:
    return f"{run_prefix(project, name)}/outputs"


def run_output(project: str, name: str, output: str) -> str:
    """One named output a program saved (``ctx.save_output``), byte for byte."""
    return f"{outputs_folder(project, name)}/{output}"


def logs_folder(project: str, name: str) -> str:
    return f"{run_prefix(project, name)}/logs"


def program_log(project: str, name: str, attempt: int) -> str:
    """What a Python program printed while its actor of ``attempt`` ran it (replays excluded)."""
    return f"{logs_folder(project, name)}/{attempt:0{_EPOCH_DIGITS}d}.txt"


def sources_folder(project: str) -> str:
    return f"{_PROJECTS}/{project}/sources"


def agent_source(project: str, digest: str) -> str:
    """An Agent's source files, by the hex SHA-256 of their canonical JSON: written once, shared
    by every revision (and so every run) that names the digest."""
    return f"{sources_folder(project)}/{digest}.json"
