"""The nodus engine that runs inside Ray: control plane, run actors, journal, sandbox, models.

The public surface for users is the ``nodus`` SDK; this package is imported by Ray workers
and by ``nodus up``. In a Ray worker, pyarrow is loaded here, before any engine module asks
for it, without numpy (`_arrow`: a run actor's process starts leaner).
"""

from nodus_ray._arrow import load_pyarrow

load_pyarrow()

__all__: list[str] = []
