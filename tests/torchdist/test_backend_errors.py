"""GPUs or a backend the ranks cannot have: refused before any rank starts where the ranks
run on this machine, else by the ranks themselves, said once with the ranks named.

(A backend this torch lacks is refused on the ranks the same way before any rendezvous:
``mpi/case_torchrun.py`` checks it there.)"""

from __future__ import annotations

import os
import socket

import psutil
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import clusterkernel.client.magics as ck_magics
from clusterkernel import Cluster, ClusterError
from clusterkernel.client.cluster._preflight import nvidia_device_visible
from clusterkernel.client.launch._run_dir import RUN_ROOT_ENV
from tests._procs import wait_no_cluster_processes

no_gpu = pytest.mark.skipif(
    nvidia_device_visible(os.environ), reason="this machine has GPUs: the requests can work"
)


def _mpi_children() -> list[str]:
    names = ("mpiexec", "prterun", "ipengine", "ipyparallel")
    procs = psutil.Process().children(recursive=True)
    return [" ".join(p.cmdline()) for p in procs if any(n in " ".join(p.cmdline()) for n in names)]


@no_gpu
def test_gpus_or_nccl_on_a_machine_without_gpus_are_refused_before_any_rank_starts(
    tmp_path, monkeypatch
):
    # every start makes its run directory under this root before it launches anything
    runs = tmp_path / "runs"
    monkeypatch.setenv(RUN_ROOT_ENV, str(runs))
    with pytest.raises(ValueError, match=r"gpus_per_rank=1 .* has no GPU .*Leave it out"):
        Cluster(n=2, gpus_per_rank=1)
    with pytest.raises(ValueError, match=r"backend='nccl' .* has no GPU .*backend='gloo'"):
        Cluster(n=2, hosts="localhost:2", backend="nccl")  # this machine by name, too
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "clusterkernel")
    assert ck_magics._magics.cluster is None or not ck_magics._magics.cluster.running
    for line, said in [
        ("start -n 2 --gpus-per-rank 1", "--gpus-per-rank 1"),
        ("start -n 2 --backend nccl", "--backend gloo"),
    ]:
        with pytest.raises(UsageError, match=r"has no GPU") as info:
            shell.run_line_magic("mpi", line)
        assert said in str(info.value) and "[rank" not in str(info.value)
    assert not runs.exists(), "a start began"
    assert _mpi_children() == []


@no_gpu
def test_ranks_elsewhere_check_themselves_and_one_error_names_all_ranks(
    no_shared_cluster, tmp_path
):
    # a hostfile may name other machines: the ranks check what they find where they run
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    cluster = Cluster(n=2, hostfile=str(hostfile), gpus_per_rank=1)  # not refused here
    lines: list[str | None] = []
    with pytest.raises(ClusterError) as info:
        cluster.start(progress=lines.append)
    said = str(info.value)
    assert "Setting torchrun's environment and each rank's GPU failed" in said
    # the ranks' identical answers once, with both ranks and their host
    host = socket.gethostname()
    assert f"[ranks 0-1 on {host}] GpuBindingError: this host has no GPU" in said, said
    assert said.count("this host has no GPU") == 1 and "rank 0 on" not in said
    # the progress callback heard the start, and that it ended (its line goes away)
    assert "Starting 2 MPI ranks: 2 of 2 registered" in lines and lines[-1] is None
    assert None not in lines[:-1]
    assert not wait_no_cluster_processes(20)
