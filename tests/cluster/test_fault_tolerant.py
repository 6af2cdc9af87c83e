"""A fault-tolerant job (Open MPI ULFM): a dead rank is reported, the others carry on.

Without ``fault_tolerant=True`` a dead rank ends the whole job (tested in
test_engine_set.py); with it the cell names the dead rank, survivors blocked on it
in a collective get an MPI error instead of a hang, later cells run on the live
ranks, and ``restart()`` brings back a full set.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from clusterkernel import Cluster, ClusterError, RankError
from clusterkernel.client.output import RankOutput
from tests._procs import wait_no_cluster_processes


class _Recorder:
    """A renderer that keeps each rank's latest output."""

    def __init__(self) -> None:
        self.last: dict[int, RankOutput] = {}

    def update(self, rank: int, out: RankOutput) -> None:
        self.last[rank] = out

    def notice(self, text: str) -> None:
        pass

    def finish(self) -> None:
        pass


def test_dead_rank_is_reported_and_the_others_carry_on(no_shared_cluster):
    cluster = Cluster(n=3, fault_tolerant=True).start()
    try:
        cluster.run(
            "import os, signal, time\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.Get_rank()"
        )
        assert cluster.pull("r") == {0: 0, 1: 1, 2: 2}

        # rank 2 dies in the middle of a cell while 0 and 1 wait for it in a Barrier:
        # they must get an error from MPI, not hang (the watchdog would say so).
        rec = _Recorder()
        cell = (
            "if r == 2:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            "time.sleep(0.5)\n"
            "try:\n    MPI.COMM_WORLD.Barrier()\n"
            "except MPI.Exception as e:\n    print('barrier failed:', e.Get_error_class())\n"
        )
        with pytest.raises(RankError) as info:
            cluster.run(cell, timeout=60, renderer=rec)
        err = info.value
        assert [f.ranks for f in err.failures] == [[2]]
        assert err.failures[0].kind == "died"
        assert "ranks 0-1" in err.note
        for r in (0, 1):
            assert "barrier failed" in rec.last[r].stdout
        assert cluster.lost is None and cluster.live_ranks == [0, 1]

        # everything now speaks of the live ranks; asking for the dead one says why
        assert cluster.pull("r") == {0: 0, 1: 1}
        with pytest.raises(ClusterError, match="Rank 2 died"):
            cluster.pull("r", ranks=[2])
        states = {row["rank"]: row["state"] for row in cluster.status()}
        assert states == {0: "idle", 1: "idle", 2: "dead"}

        # a rank that dies between cells is noticed before the next cell is sent
        pid1 = cluster.rank_info[1]["pid"]
        os.kill(pid1, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while 1 in cluster.live_ranks and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cluster.live_ranks == [0]
        rec = _Recorder()
        cluster.run("print('still here', r)", renderer=rec)
        assert set(rec.last) == {0} and "still here 0" in rec.last[0].stdout

        cluster.restart()
        assert cluster.live_ranks == [0, 1, 2] and cluster.dead == {}
        rec = _Recorder()
        cluster.run("from mpi4py import MPI\nprint(MPI.COMM_WORLD.Get_rank())", renderer=rec)
        assert {r: o.stdout.strip() for r, o in rec.last.items()} == {0: "0", 1: "1", 2: "2"}
    finally:
        cluster.stop()
    left = wait_no_cluster_processes(20)
    assert not left, f"left behind: {[p.cmdline() for p in left]}"
