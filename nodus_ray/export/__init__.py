"""Exports: a run's trajectory and an evaluation's cases in formats other tools read.

Pure builders, one module a format: `transcript` reads a run's journal records into what was
said and done; `atif` (the Agent Trajectory Interchange Format), `journal_jsonl` (the records,
one a line), `inspect_log` (Inspect's eval log) and `case_table` (an evaluation's cases as JSONL
or Parquet) shape it. Each builder masks the run's secret values (`core.redaction.Redactor`)
over the whole document it returns, on top of the masking the run did when it journaled.

May import: `core`, `durable.journal_log` and `durable.steps` (the records' shape),
`store.timestamps`, the SDK's schemas, the standard library and ``pyarrow``; no Ray, no storage,
no clock. The control plane's
`control.exports` reads what they need and serves them.
"""
