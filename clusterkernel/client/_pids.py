"""Whether a process id names a live process on this machine, and which processes a
cluster started here (client side).

Example::

    pid_alive(os.getpid())   # True
    marked("/tmp/nowhere")   # []: no process carries that cluster's mark
"""

from __future__ import annotations

import os

from clusterkernel.protocol._names import RUN_DIR_ENV
from clusterkernel.protocol._procs import pid_alive

# Every rank's environment names its cluster's run directory: every process under the
# ranks (their nannies, respawned ranks) carries it, also once its parent is gone.
CLUSTER_MARK = RUN_DIR_ENV


def marked(run_dir: str) -> list:
    """This user's live processes whose environment marks them as ``run_dir``'s cluster's."""
    import psutil

    out = []
    me = os.getpid()
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.pid == me or proc.info["uids"].real != os.getuid():
                continue
            if proc.environ().get(CLUSTER_MARK) == run_dir and pid_alive(proc.pid):
                out.append(proc)
        except (psutil.Error, OSError):  # gone meanwhile, or not ours to read
            continue
    return out
