"""Count the MPI/ipyparallel cluster processes that this test session started.

A workstation may run other clusters at the same time (a notebook with ``%mpi
start``, another user's job): those are none of the tests' business. So the test
session marks itself: importing this module (``tests/conftest.py`` does, before any
test runs) puts a unique ``CLUSTERKERNEL_TEST_SESSION=<uuid>`` into ``os.environ``,
every process the tests start inherits it (controllers, mpiexec, daemons, ranks,
notebook kernels), and only processes whose environment carries this session's
value are counted.

Example::

    from tests._procs import cluster_processes, wait_no_cluster_processes

    assert not wait_no_cluster_processes(20), "this session's cluster outlived stop()"
"""

from __future__ import annotations

import os
import time
import uuid

import psutil

from clusterkernel.protocol import _procs

SESSION_VAR = "CLUSTERKERNEL_TEST_SESSION"
# setdefault: a pytest started by a test (on MPI ranks, say) belongs to the same session
SESSION = os.environ.setdefault(SESSION_VAR, uuid.uuid4().hex)

_MARKERS = (
    "clusterkernel.client.kernel",  # an MPI kernel, which owns a cluster
    "ipyparallel.engine",
    "clusterkernel.rank._warm_start",  # the ranks' engine command (it runs ipyparallel's)
    "ipyparallel.controller",
    "clusterkernel.client.launch._handover",  # the login node's controller, from outside
    "prterun",
    "prted",
    "clusterkernel.client.launch._guard",
)


def started_by_this_session(proc: psutil.Process) -> bool:
    """Whether ``proc`` inherited this test session's marker (False if unreadable)."""
    try:
        return proc.environ().get(SESSION_VAR) == SESSION
    except psutil.Error:  # gone, a zombie, or another user's
        return False


def cluster_processes() -> list[psutil.Process]:
    """The live ipyparallel/MPI cluster processes that this test session started.

    Clusters started outside the tests (a notebook's, another user's) are ignored.
    """
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if any(m in cmd for m in _MARKERS) and started_by_this_session(proc):
            found.append(proc)
    return found


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``procs`` still running (zombies count as gone: ``protocol._procs.alive``)."""
    return [proc for proc in procs if _procs.alive(proc)]


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` s until none of ``procs`` runs; return those still running."""
    deadline = time.monotonic() + timeout
    left = alive(procs)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = alive(procs)
    return left


def wait_no_cluster_processes(timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` s until :func:`cluster_processes` is empty; return what is left."""
    deadline = time.monotonic() + timeout
    left = cluster_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = cluster_processes()
    return left


def wait_dead(cluster, ranks: list[int], timeout: float = 30) -> None:
    """Wait until ``cluster`` knows that each of ``ranks`` died (its ``dead``)."""
    deadline = time.monotonic() + timeout
    while set(ranks) - set(cluster.dead) and time.monotonic() < deadline:
        cluster.live_ranks  # noqa: B018 (reads the controller's news of dead engines)
        time.sleep(0.1)
    assert set(ranks) <= set(cluster.dead), cluster.dead
