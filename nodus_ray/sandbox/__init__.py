"""Where untrusted commands run: bubblewrap with seccomp, rlimits and a disk cap.

One sandbox per run, one command at a time, with the workspace snapshotted to storage so a
run can move nodes. The process fallback (no bubblewrap) is said so in a run's status.

May import: ``egress`` (the proxy a sandbox may be given), ``store``. No Ray, no models.
"""
