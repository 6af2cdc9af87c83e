"""Count the processes that belong to MPI/ipyparallel clusters on this machine."""

from __future__ import annotations

import time

import psutil

_MARKERS = (
    "ipyparallel.engine",
    "ipyparallel.controller",
    "prterun",
    "prted",
    "clusterkernel._guard",
)


def cluster_processes() -> list[psutil.Process]:
    """Every process on this machine that belongs to some ipyparallel/MPI cluster."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if any(m in cmd for m in _MARKERS):
            found.append(proc)
    return found


def wait_no_cluster_processes(timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    left = cluster_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = cluster_processes()
    return left
