"""Durable execution: a run's append-only journal and journaled steps that replay.

`journal.Journal` stores records as Arrow IPC segments in storage; `steps.Steps` executes a
step once, returns its recorded result on replay, and parks a step whose outcome is unknown.

May import: ``store``, ``faults``, ``metrics``, ``tracing``. No Ray actors, no sandbox, no models.
"""
