"""Processes this test run started (descendants of the pytest process), and waiting for them."""

from __future__ import annotations

import time

import psutil

# what an MPI kernel runs: the kernel itself and its cluster
MARKERS = ("clusterkernel.kernel", "ipyparallel", "prterun", "prted", "clusterkernel._guard")


def my_cluster_processes() -> list[psutil.Process]:
    """This process's descendants that belong to an MPI kernel or its cluster."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if any(m in cmd for m in MARKERS):
            found.append(proc)
    return found


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    left = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc)
        except psutil.Error:
            pass
    return left


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until none of ``procs`` runs; return those still running after ``timeout``."""
    deadline = time.monotonic() + timeout
    left = alive(procs)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = alive(procs)
    return left
