"""A rank that dies on the other Slurm node comes back on that node, inside the same job.

``Cluster(launcher="slurm", respawn=True)`` starts the engines with Open MPI's
``mpiexec`` inside the batch job (``srun`` ends the whole step when one task dies):
PRRTE's daemons run on both nodes of the allocation, the survivors outlive the dead
rank, and a respawn spawns its replacement on the node it died on: by hand between
cells, and by the survivors themselves inside a running ``train.steps`` cell. Real
Slurm, two nodes (network and UTS namespaces), real SIGKILL; afterwards collectives
span all four ranks, the trained weights are the undisturbed run's, and nothing is
left on either node.
"""

from __future__ import annotations

import io
from contextlib import contextmanager

import pytest

from clusterkernel import Cluster, RankError
from clusterkernel.client.output import TerminalRenderer
from tests._batch_beds import parent_crashed
from tests._open_mpi import once_more_on_open_mpi_abort

_STATE = """
import os, socket, threading
from mpi4py import MPI
lock = threading.Lock()          # cannot be pickled: stays only where it was made
pid, host = os.getpid(), socket.gethostname()
weights = [float(MPI.COMM_WORLD.Get_rank())] * 3
"""


def _quiet(cluster: Cluster) -> TerminalRenderer:
    return TerminalRenderer(cluster.ranks, stream=io.StringIO())


@contextmanager
def _job(testbed, holder, **options):
    """Four ranks over node1 and node2 in a job of their own (the shared cluster stopped:
    one at a time on 2 cores); stopped at the end, nothing left on either node.

    One job per test: in a job across the two nodes the second successor spawned onto
    node2 fails in Open MPI 5.0.11 whichever way the first came (the survivors cannot
    reach it, "host: unknown", or node2's daemon dies and the job with it; reproduced
    with plain mpi4py ``MPI.COMM_SELF.Spawn`` with ``host=node2`` twice), so a test that
    respawns starts from a job that has not. On a failure the job's launcher log is
    printed: it is where PRRTE says a daemon was lost.
    """
    if holder.cluster is not None:
        holder.cluster.stop()
        holder.cluster = None
    cluster = Cluster(n=4, launcher="slurm", nodes=2, **options).start()
    try:
        yield cluster
    except BaseException:
        print("the job's launcher log, last lines:\n" + cluster.job_output(lines=60))
        raise
    finally:
        cluster.stop()
    jobs, on1, on2 = testbed.leftovers()
    assert not jobs and not on1 and not on2, (jobs, on1, on2)


def test_a_rank_killed_on_node2_is_respawned_on_node2(slurm_testbed, _shared_holder):
    # once more only where Open MPI aborted itself (tests/_open_mpi.py)
    once_more_on_open_mpi_abort(
        lambda: _job(slurm_testbed, _shared_holder, fault_tolerant=True), _respawned_by_hand
    )


def _respawned_by_hand(cluster: Cluster) -> None:
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


def _parent_crashed(cluster, rank: int, parent: str) -> RankError:
    """:func:`parent_crashed` in a job that holds this file's state first."""
    cluster.run(_STATE, renderer=_quiet(cluster), timeout=60)
    return parent_crashed(cluster, rank, parent)


def test_a_daemon_that_crashes_on_node2_is_named_with_the_ranks_it_took(
    slurm_testbed, _shared_holder
):
    """node2's Open MPI daemon (prted, which srun started as its task 0) dies of SIGSEGV
    mid-cell: the user is told that daemon died and ranks 2-3 with it (not that rank 0
    was killed by SIGSEGV), ranks 0-1 stopped by mpiexec; nothing is left on either node."""
    with _job(slurm_testbed, _shared_holder, fault_tolerant=True) as cluster:
        error = _parent_crashed(cluster, 2, "prted")  # rank 2 runs on node2
        failures = {(f.kind, tuple(f.ranks)): f.summary for f in error.failures}
        said = str(error)
        daemon = "Open MPI's daemon on node2 died (killed by SIGSEGV)"
        assert set(failures) == {("died", (2, 3)), ("stopped", (0, 1))}, said
        assert daemon in failures["died", (2, 3)], said
        assert "Open MPI's launcher lost node2" in said, said
        assert cluster.lost and daemon in cluster.lost and "ranks 2-3 with it" in cluster.lost


def test_a_launcher_that_crashes_in_the_batch_job_is_named_and_no_rank_is_blamed(
    slurm_testbed, _shared_holder
):
    """The job's mpiexec (prterun, run by the batch script on node1) dies of SIGSEGV
    mid-cell, leaving no report of its own: the job script's shell says it, and the user
    is told the launcher crashed (no rank blamed); nothing is left on either node."""
    with _job(slurm_testbed, _shared_holder, fault_tolerant=True) as cluster:
        error = _parent_crashed(cluster, 0, "prterun")  # rank 0 runs on node1
        said = str(error)
        assert [(f.kind, f.ranks) for f in error.failures] == [("stopped", [0, 1, 2, 3])]
        assert "The launcher's own process ended, not a rank's" in said, said
        crashed = "the launcher (mpiexec) crashed (killed by SIGSEGV)"
        assert cluster.lost and crashed in cluster.lost, (cluster.lost, cluster.job_output(80))


_TRAIN = """
import os, signal, socket, torch
from clusterkernel import comm, train
from clusterkernel.train import DataParallel
torch.manual_seed(0)
net = torch.nn.Sequential(
    torch.nn.Linear(6, 8), torch.nn.Dropout(0.2), torch.nn.Tanh(), torch.nn.Linear(8, 1)
)
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
dp = DataParallel(net, optimizer=opt)
def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)   # data by step and rank
    return torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)
VICTIM = os.getpid() if DIE and comm.rank() == 3 else None   # rank 3 runs on node2
"""

_LOOP = """
for s in train.steps(24, model=net, optimizer=opt):
    with s:
        if s.index == 12 and os.getpid() == VICTIM:
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch(s.index, comm.rank())
        opt.zero_grad()
        torch.nn.functional.mse_loss(dp(x), y).backward()
        opt.step()
weights = torch.cat([p.detach().flatten() for p in net.parameters()])
where = (s.index, os.getpid(), socket.gethostname())
"""


def test_a_train_steps_cell_survives_a_death_on_node2_by_itself(slurm_testbed, _shared_holder):
    """``respawn=True``: rank 3, on node2, SIGKILLed at step 12 of a ``train.steps``
    DataParallel loop of 24; the survivors bring it back in the cell, on node2, and every
    rank ends at the undisturbed run's weights (dropout on: the RNG follows)."""

    def body(cluster: Cluster) -> None:
        assert cluster.fault_tolerant and cluster.auto_respawn
        _trained_through_a_death(cluster, slurm_testbed)

    once_more_on_open_mpi_abort(lambda: _job(slurm_testbed, _shared_holder, respawn=True), body)


def _trained_through_a_death(cluster: Cluster, testbed) -> None:
    cluster.run("DIE = False\n" + _TRAIN + _LOOP, renderer=_quiet(cluster))
    undisturbed = cluster.pull("weights")[0]
    cluster.run("DIE = True\n" + _TRAIN, renderer=_quiet(cluster))
    old = cluster.rank_info[3]["pid"]
    job = cluster.job_id
    out = io.StringIO()
    cluster.run(_LOOP, renderer=TerminalRenderer(cluster.ranks, stream=out), timeout=120)
    said = out.getvalue()
    assert "Rank 3 died (killed by SIGKILL) during this cell and was respawned" in said, said
    assert cluster.live_ranks == [0, 1, 2, 3] and not cluster.dead and cluster.job_id == job
    where = cluster.pull("where")
    assert {r: w[0] for r, w in where.items()} == dict.fromkeys(range(4), 23)
    assert where[3][1] != old and where[3][1] == cluster.rank_info[3]["pid"], (old, where)
    assert [where[r][2] for r in range(4)] == ["node1", "node1", "node2", "node2"], where
    assert old not in testbed.pids_on("node2")  # the killed process is gone
    for rank, weights in cluster.pull("weights").items():
        assert (weights - undisturbed).abs().max().item() < 1e-5, rank
