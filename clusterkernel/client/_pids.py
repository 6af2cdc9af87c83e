"""Whether a process id names a live process on this machine, and which processes a
cluster started here (client side).

Example::

    pid_alive(os.getpid())   # True
    marked("/tmp/nowhere")   # []: no process carries that cluster's mark
"""

from __future__ import annotations

import os


def pid_alive(pid: int | None) -> bool:
    """Whether ``pid`` runs here: another user's process counts, a zombie (its parent
    has not reaped it) does not."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


# Every rank's environment names its cluster's run directory: every process under the
# ranks (their nannies, respawned ranks) carries it, also once its parent is gone.
CLUSTER_MARK = "CLUSTERKERNEL_CLUSTER"


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
