"""Respawns keep working after a respawned rank exits with an error.

Open MPI 5.0 (PRRTE 3.0) refuses every later spawn (``MPI_ERR_INTERN``; PMIx's connect
"not supported") once a process of a spawned MPI job of several has exited with a
non-zero code while another process of that job lives on; a SIGKILLed one, or one that
was its job's only process, leaves spawning working. Two ranks that died together used
to be spawned as one job (``MPI_Comm_spawn_multiple``), so the earlier notes' chain of
deaths (a copy that kills its new rank, then a source that dies pickling: ``os._exit``)
broke every later respawn when the source was one of such a pair. Each new process is
now its own job (BENCHMARKS.md, "Faults", the chain of deaths). Real ranks, real exits.
"""

from __future__ import annotations

import os
import signal

import pytest

from clusterkernel import Cluster, RankError
from tests._procs import wait_dead, wait_no_cluster_processes


def test_a_rank_respawned_with_another_that_exits_with_an_error_leaves_respawns_working(
    no_shared_cluster,
):
    c = Cluster(n=3, fault_tolerant=True, env={"OMP_NUM_THREADS": "1"}).start()
    try:
        for r in (1, 2):
            os.kill(c.rank_info[r]["pid"], signal.SIGKILL)
        wait_dead(c, [1, 2])
        assert c.respawn().ranks == [1, 2]  # both in one respawn
        c.run("from clusterkernel.rank._respawn import phases\n_ = phases()")
        # rank 1 ends with an exit code (what a variable whose pickling calls os._exit does)
        with pytest.raises(RankError) as info:
            c.run("import os\nos._exit(3)", ranks=[1], timeout=60)
        assert [f.ranks for f in info.value.failures if f.kind == "died"] == [[1]]
        wait_dead(c, [1])
        pid2 = c.rank_info[2]["pid"]
        assert c.respawn(source=0).ranks == [1]  # failed with MPI_ERR_INTERN before
        assert c.rank_info[2]["pid"] == pid2 and not c.dead
        c.run(
            "from clusterkernel.rank._world import world\ntotal = world().allreduce(1)\n"
            "done = [p['phase'] for p in phases()]"
        )
        assert c.pull("total") == {0: 3, 1: 3, 2: 3}
        # the respawn's parts were timed on every rank (what bench_incell prints)
        done = c.pull("done")
        for r in (0, 2):
            assert {"shrink", "spawn", "merge", "agree", "keys"} <= set(done[r]), done[r]
        assert {"started", "merge", "keys", "receive", "load"} <= set(done[1]), done[1]
    finally:
        c.stop()
    assert not wait_no_cluster_processes(20)
