"""A rank that dies on the other Slurm node comes back on that node, inside the same job.

``Cluster(launcher="slurm", fault_tolerant=True)`` starts the engines with Open MPI's
``mpiexec`` inside the batch job (``srun`` ends the whole step when one task dies):
PRRTE's daemons run on both nodes of the allocation, the survivors outlive the dead
rank, and ``respawn`` spawns its replacement on the node it died on. Real Slurm, two
nodes (network and UTS namespaces), real SIGKILL; afterwards a collective spans all
four ranks and nothing is left on either node.
"""

from __future__ import annotations

import io

import pytest

from clusterkernel import Cluster, RankError
from clusterkernel.client.output import TerminalRenderer

_STATE = """
import os, socket, threading
from mpi4py import MPI
lock = threading.Lock()          # cannot be pickled: stays only where it was made
pid, host = os.getpid(), socket.gethostname()
weights = [float(MPI.COMM_WORLD.Get_rank())] * 3
"""


def _quiet(cluster: Cluster) -> TerminalRenderer:
    return TerminalRenderer(cluster.ranks, stream=io.StringIO())


def test_a_rank_killed_on_node2_is_respawned_on_node2(slurm_testbed, _shared_holder):
    if _shared_holder.cluster is not None:  # one cluster at a time on 2 cores
        _shared_holder.cluster.stop()
        _shared_holder.cluster = None
    cluster = Cluster(n=4, launcher="slurm", nodes=2, fault_tolerant=True).start()
    try:
        job = cluster.job_id
        cluster.run(_STATE, renderer=_quiet(cluster), timeout=60)
        before = {r: (row["pid"], row["host"]) for r, row in enumerate(cluster.status())}
        assert before[3][1] == "node2" and before[0][1] == "node1", before
        kill = "import signal\nif MPI.COMM_WORLD.Get_rank() == 3:\n    os.kill(os.getpid(), signal.SIGKILL)\nimport time; time.sleep(1)"
        with pytest.raises(RankError) as info:
            cluster.run(kill, renderer=_quiet(cluster), timeout=60)
        assert [f.ranks for f in info.value.failures if f.kind == "died"] == [[3]]
        assert cluster.job_id == job and cluster.live_ranks == [0, 1, 2]

        report = cluster.respawn(source=0)
        assert report.ranks == [3] and "lock" in report.skipped, report.summary()
        assert cluster.live_ranks == [0, 1, 2, 3] and cluster.job_id == job
        cluster.run(
            # MPI.COMM_WORLD still holds the dead process: the N ranks' world is comm's
            "import os, socket, torch\nfrom clusterkernel import comm\n"
            "now = (os.getpid(), socket.gethostname())\n"
            "t = torch.ones(1) * comm.rank(); comm.all_reduce(t); total = int(t.item())\n"
            "mpi_total = comm.WORLD.comm.allreduce(comm.WORLD.comm.Get_rank())\n"
            "has_lock = 'lock' in globals()",
            renderer=_quiet(cluster),
            timeout=60,
        )
        now = cluster.pull("now")
        assert {r: tuple(now[r]) for r in (0, 1, 2)} == {r: before[r] for r in (0, 1, 2)}
        assert now[3][1] == "node2" and now[3][0] != before[3][0]  # a new process, on node2
        assert set(cluster.pull("total").values()) == {6}
        assert set(cluster.pull("mpi_total").values()) == {6}  # the public mpi4py world
        assert cluster.pull("has_lock") == {0: True, 1: True, 2: True, 3: False}
        assert cluster.pull("weights")[3] == [0.0] * 3  # rank 0's copy
    finally:
        cluster.stop()
    jobs, on1, on2 = slurm_testbed.leftovers()
    assert not jobs and not on1 and not on2, (jobs, on1, on2)
