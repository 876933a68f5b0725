"""The nodus engine that runs inside Ray: control plane, run actors, journal, sandbox, models.

The public surface for users is the ``nodus`` SDK; this package is imported by Ray workers
and by ``nodus up``.
"""

__all__: list[str] = []
