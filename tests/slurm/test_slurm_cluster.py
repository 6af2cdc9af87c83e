"""Ranks started through a real Slurm on two nodes (the test bed of conftest.py).

One Slurm-launched cluster is shared by the module's tests; the tests about
starting and dying start their own. Every test looks on both nodes for what it
left behind.
"""

from __future__ import annotations

import _thread
import io
import os
import re
import stat
import textwrap
import threading
import time

import psutil
import pytest

from clusterkernel import Cluster
from clusterkernel.client.errors import CellInterrupted, ClusterError, RankError
from clusterkernel.client.output import TerminalRenderer


def _quiet(cluster: Cluster) -> TerminalRenderer:
    return TerminalRenderer(cluster.ranks, stream=io.StringIO())


@pytest.fixture(scope="module")
def slurm_cluster(slurm_testbed, _shared_holder):
    if _shared_holder.cluster is not None:  # one cluster at a time on 2 cores
        _shared_holder.cluster.stop()
        _shared_holder.cluster = None
    cluster = Cluster(n=4, launcher="slurm", nodes=2).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def sc(slurm_cluster):
    if slurm_cluster.lost:
        slurm_cluster.restart()
    return slurm_cluster


def test_ranks_spread_over_both_nodes_as_one_mpi_world(sc, slurm_testbed):
    hosts = {row["rank"]: row["host"] for row in sc.status()}
    assert hosts == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    assert sc.job_id in slurm_testbed.jobs()
    sc.run(
        "from clusterkernel import comm\nimport torch\n"
        "t = torch.full((1000,), float(comm.rank() + 1))\ncomm.all_reduce(t)\n",
        renderer=_quiet(sc),
    )
    assert all(set(t.tolist()) == {10.0} for t in sc.pull("t").values())
    assert {r: int(v) for r, v in sc.pull("mpi_size").items()} == {r: 4 for r in range(4)}


def test_torch_distributed_across_both_nodes_from_torchruns_environment(sc):
    sc.run(
        "import os, torch, torch.distributed as dist\n"
        "env = {k: os.environ[k] for k in ('LOCAL_RANK', 'GROUP_RANK', 'NODE_RANK', 'MASTER_ADDR')}\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.full((100,), float(dist.get_rank() + 1))\n"
        "dist.all_reduce(t)\n"
        "total = t.max().item()\n"
        "dist.destroy_process_group()\n",
        renderer=_quiet(sc),
    )
    envs = sc.pull("env")
    assert [envs[r]["LOCAL_RANK"] for r in range(4)] == ["0", "1", "0", "1"]
    assert [envs[r]["NODE_RANK"] for r in range(4)] == ["0", "0", "1", "1"]
    addr = {envs[r]["MASTER_ADDR"] for r in range(4)}
    assert len(addr) == 1 and addr.pop().startswith("10.231."), envs  # node1's link address
    assert sc.pull("total") == {r: 10.0 for r in range(4)}


def test_controller_listens_only_on_the_nodes_network(sc, slurm_testbed):
    ctl = psutil.Process(sc._engines.ipp.controller.pid)
    procs = [ctl, *ctl.children(recursive=True)]
    listening = {
        c.laddr.ip
        for p in procs
        for c in p.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }
    # the nodes' network for the engines, loopback for this notebook's client
    assert listening == {slurm_testbed.controller_address, "127.0.0.1"}


def test_job_files_are_private_and_not_in_the_current_directory(sc):
    run_dir = sc.run_dir
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    es = sc._engines.engine_set
    assert os.path.dirname(es.batch_file) == run_dir
    assert os.path.dirname(es.output_file) == run_dir
    assert not [f for f in os.listdir(".") if f.startswith(("slurm-", "slurm_engine"))]


def test_stacks_and_locals_of_ranks_on_the_other_node(sc):
    code = textwrap.dedent(
        """\
        from mpi4py import MPI
        marker = 100 + MPI.COMM_WORLD.Get_rank()
        if MPI.COMM_WORLD.Get_rank() != 3:
            MPI.COMM_WORLD.Barrier()
        """
    )
    run = sc.run(code, block=False, renderer=_quiet(sc))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and sorted(run.busy_ranks()) != [0, 1, 2]:
        time.sleep(0.1)
    stacks = sc.stacks([1, 2], code=code, with_locals=True)
    assert "Cell line 4" in stacks[2] and "MPI.COMM_WORLD.Barrier()" in stacks[2]
    assert re.search(r"marker\s+= 102", stacks[2]), stacks[2]
    with pytest.raises(CellInterrupted) as info:
        run.wait(timeout=1)
    stuck = [f for f in info.value.failures if "did not respond" in f.summary]
    assert stuck and stuck[0].ranks == [0, 1, 2]
    assert "MPI.COMM_WORLD.Barrier()" in stuck[0].detail  # rank 2 is on node2
    assert "not available" not in str(info.value)
    sc.run("print('usable again')", renderer=_quiet(sc))


def test_debug_a_rank_on_the_other_node(sc):
    # post-mortem of rank 2's error, then its breakpoint(): both through node2's engine
    code = "import socket\nfrom mpi4py import MPI\nhost = socket.gethostname()\n"
    with pytest.raises(RankError):
        sc.run(
            code + "if MPI.COMM_WORLD.Get_rank() == 2:\n    raise ValueError(host)\n",
            renderer=_quiet(sc),
        )
    with sc.debug([2]) as dbg:
        assert dbg.send("p host") == {2: "'node2'"}
    code = "if MPI.COMM_WORLD.Get_rank() == 2:\n    breakpoint()\n    mark = host + '!'\nx = 1\n"
    run = sc.run(code, block=False, renderer=_quiet(sc))
    try:
        deadline = time.monotonic() + 30
        while sc.debug([2]).state[2] != "breakpoint":
            assert time.monotonic() < deadline, "rank 2 did not stop at breakpoint()"
            time.sleep(0.2)
        dbg = sc.debug([2])
        dbg.send("n")
        assert dbg.send("p mark") == {2: "'node2!'"}
        dbg.send("c")
        run.wait(timeout=30)
    finally:
        sc.debug([2]).release()


def test_interrupt_reaches_ranks_on_both_nodes(sc):
    pids = [r["pid"] for r in sc.status()]
    timer = threading.Timer(2.0, _thread.interrupt_main)  # what a kernel interrupt does
    timer.start()
    with pytest.raises(CellInterrupted) as info:
        sc.run("import time\ntime.sleep(60)", renderer=_quiet(sc))
    timer.cancel()
    assert info.value.failures[0].ranks == [0, 1, 2, 3]
    assert "SIGINT stopped it" in info.value.failures[0].summary
    assert [r["pid"] for r in sc.status()] == pids  # freed without a restart


def test_a_rank_that_dies_on_the_other_node_is_named(sc):
    code = "import os, time\nfrom mpi4py import MPI\nif MPI.COMM_WORLD.Get_rank() == 3:\n    os._exit(3)\ntime.sleep(30)"
    with pytest.raises(RankError) as info:
        sc.run(code, renderer=_quiet(sc))
    died = [f for f in info.value.failures if f.kind == "died"]
    assert died and died[0].ranks == [3], str(info.value)
    assert "exit code 3" in died[0].summary
    with pytest.raises(ClusterError, match="rank 3 died"):
        sc.run("pass")
    sc.restart()
    assert {row["host"] for row in sc.status()} == {"node1", "node2"}
