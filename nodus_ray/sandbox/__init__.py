"""Where untrusted commands run: bubblewrap with seccomp, rlimits and a disk cap.

One sandbox per run, one command at a time, with the workspace snapshotted to storage so a
run can move nodes. The process fallback (no bubblewrap) is said so in a run's status.

May import: ``egress`` (the proxy a sandbox may be given), ``store``. No Ray, no models.

Modules
-------
* :mod:`~nodus_ray.sandbox.api`: ``SandboxLimits``, ``CommandResult`` and the ``Sandbox`` Protocol;
* :mod:`~nodus_ray.sandbox.backend`: the bubblewrap probe, ``bwrap_available``, ``create_sandbox``;
* :mod:`~nodus_ray.sandbox.bubblewrap`: bubblewrap's command line and ``BubblewrapSandbox``;
* :mod:`~nodus_ray.sandbox.process`: ``ProcessSandbox``, the fallback;
* :mod:`~nodus_ray.sandbox.runner`: one command's run (deadline, output cap, cancel), both backends;
* :mod:`~nodus_ray.sandbox.limits`: the ``ulimit`` prologue and which limit a command hit;
* :mod:`~nodus_ray.sandbox.workspace`: the sandbox uid and the workspace's ownership and mode;
* :mod:`~nodus_ray.sandbox.hidden`: the host paths a command cannot see;
* :mod:`~nodus_ray.sandbox.images`, :mod:`~nodus_ray.sandbox.image_mounts`: an Agent's
  ``spec.image`` resolved to a digest, unpacked once per node, and mounted as the root;
* :mod:`~nodus_ray.sandbox.seccomp`, :mod:`~nodus_ray.sandbox.disk_usage`,
  :mod:`~nodus_ray.sandbox.snapshots`: the system call filter, the disk cap, workspace snapshots.

Isolation model
---------------
The preferred backend is bubblewrap. Each command gets fresh mount, PID, IPC, UTS (and, unless
the run may use the network, network) namespaces:

* the host root is bind-mounted read-only, so the command can read the system's programs and
  libraries but write nowhere on the host except its workspace (when the Agent names an image,
  that image's unpacked root is mounted read-only instead, and nothing of the host's is there);
* ``/tmp`` is a private, size-capped tmpfs with the workspace bind-mounted at
  ``/tmp/workspace`` (``--ro-bind / /`` leaves no writable place to create a new mount point,
  and a private ``/tmp`` also hides the Ray session directory ``/tmp/ray``); ``/dev`` is a
  minimal private dev with its own ``/dev/shm``, which hides Ray's object store;
* ``/proc`` belongs to the new PID namespace, so the command sees only its own processes, and
  when the command's shell exits (or we kill bubblewrap) the namespace's init dies and the
  kernel kills everything left in it: nothing outlives a command;
* the environment is cleared down to PATH, HOME, LANG and TERM, so server secrets such as
  API keys never reach the model's commands;
* a seccomp filter (:mod:`nodus_ray.sandbox.seccomp`) refuses the system calls containers have been
  escaped through (mount, namespaces, ptrace, bpf, io_uring, keyrings, kernel modules...);
* the workspace's total size is capped (:mod:`nodus_ray.sandbox.disk_usage`): a command that grows it
  past ``SandboxLimits.disk_bytes`` is killed, under either backend;
* some host directories are hidden under an empty read-only tmpfs, so the command cannot even
  list them: ``/root`` and the server user's home (host credentials: SSH keys, cloud and
  registry logins), Ray's temp directory when it is outside ``/tmp`` (its session directory
  holds the raylet and object store sockets and logs), ``/run`` (the host daemons' sockets,
  such as docker.sock), and whatever the caller passes as
  ``hidden_paths`` (the control plane passes the sandbox root, so no run can browse the other
  runs' workspaces, and the local storage directory). The workspace still works when it lives
  under a hidden directory, because bubblewrap binds it at ``/tmp/workspace`` from the host's
  view of the path, not the sandbox's.

Every command runs as an unprivileged host uid (:mod:`nodus_ray.sandbox.workspace` says why),
dropped inside bubblewrap (:mod:`nodus_ray.sandbox.bubblewrap` says how).

When bubblewrap cannot run, :class:`ProcessSandbox` is the fallback: same limits, uid drop,
private workspace, cleared environment, timeout and output cap, but no filesystem or network
isolation and no hidden paths.
"""

from nodus_ray.sandbox.api import SANDBOX_WORKSPACE, CommandResult, Sandbox, SandboxLimits
from nodus_ray.sandbox.backend import bwrap_available, create_sandbox
from nodus_ray.sandbox.bubblewrap import BubblewrapSandbox
from nodus_ray.sandbox.process import ProcessSandbox
from nodus_ray.sandbox.workspace import MAX_SANDBOX_UID, MIN_SANDBOX_UID

__all__ = [
    "SandboxLimits",
    "CommandResult",
    "Sandbox",
    "BubblewrapSandbox",
    "ProcessSandbox",
    "create_sandbox",
    "bwrap_available",
    "SANDBOX_WORKSPACE",
    "MIN_SANDBOX_UID",
    "MAX_SANDBOX_UID",
]
