"""A run's only way out: the host-side egress proxy and the forwarder inside its sandbox.

`proxy` checks each connection against the Agent's ``network.allowedHosts`` (rules in
``nodus.egress_policy``) and records it; `forwarder` is a stdlib script run inside the
sandbox; `run_egress` is one run's proxy and its records.

May import: the SDK's ``egress_policy``, ``store.timestamps``. No Ray.
"""
