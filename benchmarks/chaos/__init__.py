"""The fault campaign's parts (``benchmarks/chaos.py`` runs them): its own service
(`service`), the mixed workload and what it was told was accepted (`workload`), the fault
driver (`faults`), the invariants read back from storage and the API (`checker`) and the table
(`report`)."""

__all__: list[str] = []
