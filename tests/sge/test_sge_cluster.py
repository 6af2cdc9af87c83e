"""Ranks as a real Grid Engine job (issue 37 item 2): ``%mpi start --scheduler sge``
submits one job whose ``mpiexec`` takes the job's slots (``$PE_HOSTFILE``), a cell runs
on its 4 ranks, ``%mpi stop`` leaves no job and no process; an exported ``qsub`` script
runs as a job of its own; a kernel killed outright leaves nothing either (the guard
cancels its job).

One cluster for the first test (the machine's 2 cores take one at a time); the test
bed is ``sge_testbed`` (tests/conftest.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests._procs import wait_no_cluster_processes

_CELL = """\
import os
from mpi4py import MPI
world = MPI.COMM_WORLD
here = (world.Get_rank(), world.Get_size(), world.allreduce(1), os.environ.get("JOB_ID"),
        bool(os.environ.get("PE_HOSTFILE")))
"""


@pytest.fixture
def magics(no_shared_cluster):
    import clusterkernel.client.magics as ck_magics

    InteractiveShell.instance().run_line_magic("load_ext", "clusterkernel")
    yield ck_magics._magics
    if ck_magics._magics.cluster is not None:
        ck_magics._magics.cluster.stop()
        ck_magics._magics.cluster = None


def test_the_magic_starts_ranks_in_a_grid_engine_job_and_stop_leaves_nothing(
    sge_testbed, magics, capsys
):
    magics.mpi("start -n 4 --scheduler sge --time 0:10:00")
    cluster = magics.cluster
    job = cluster.job_id
    assert job in sge_testbed.jobs() and "(sge)" in capsys.readouterr().out
    script = Path(cluster.run_dir, "engines.sge").read_text()
    assert "#$ -pe mpi 4" in script and "#$ -l h_rt=0:10:00" in script, script
    magics.mpi("", _CELL)
    here = cluster.pull("here")
    # every rank in one MPI world of 4, inside the job, on the job's slots
    assert here == {r: (r, 4, 4, job, True) for r in range(4)}, here
    magics.mpi("stop")
    jobs, pids = sge_testbed.leftovers(timeout=20)
    assert job not in jobs and not pids, (jobs, pids)
    left = wait_no_cluster_processes(20)
    assert not left, [p.cmdline() for p in left]


def test_an_exported_qsub_script_runs_on_the_jobs_ranks(sge_testbed, tmp_path):
    from clusterkernel.client.export import write_job

    cells = ["%%mpi\nfrom clusterkernel import comm\nprint('RANK', comm.rank(), comm.size())"]
    written = write_job(cells, tmp_path / "job.py", ranks=4, qsub=tmp_path / "job.qsub")
    text = written[1].read_text()
    assert "#$ -pe mpi 4" in text and "#$ -N job" in text, text
    done = subprocess.run(
        ["qsub", "-sync", "y", str(written[1])], capture_output=True, text=True, timeout=120,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    [out] = tmp_path.glob("job-*.out")
    ranks = sorted(line for line in out.read_text().splitlines() if "] RANK " in line)
    assert ranks == [f"[rank {r}] RANK {r} 4" for r in range(4)], out.read_text()


_KERNEL = """
import sys
from clusterkernel import Cluster
c = Cluster(n=2, launcher="sge").start()
print("JOB", c.run_dir, c.job_id, flush=True)
sys.stdin.read()
"""


def test_a_killed_kernel_leaves_no_job_and_no_process(sge_testbed, no_shared_cluster):
    proc = subprocess.Popen(
        [sys.executable, "-c", _KERNEL], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    line = ""
    while not line.startswith("JOB"):  # after the live "qw" line
        line = proc.stdout.readline().strip("\r\n ").split("\r")[-1].strip()
        assert line or proc.poll() is None, "the kernel process ended before its cluster started"
    _, run_dir, job = line.split()
    assert job in sge_testbed.jobs()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    jobs, pids = sge_testbed.leftovers(timeout=30)
    assert job not in jobs and not pids, (jobs, pids)
    deadline = time.monotonic() + 20
    while os.path.isdir(run_dir) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not os.path.isdir(run_dir), "the guard left the cluster's run directory"


def test_a_kept_job_survives_a_killed_kernel_and_stop_after_attach_cancels_it(
    sge_testbed, no_shared_cluster, tmp_path, monkeypatch
):
    from clusterkernel import Cluster
    from clusterkernel.client.cluster import _keep

    monkeypatch.setenv("CLUSTERKERNEL_RUN_DIR", str(tmp_path / "runs"))
    kernel = _KERNEL.replace('launcher="sge")', 'launcher="sge", keep="10m")').replace(
        ".start()\n", '.start()\nc.run("zz = 7")\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", kernel], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    line = ""
    while not line.startswith("JOB"):
        line = proc.stdout.readline().strip("\r\n ").split("\r")[-1].strip()
        assert line or proc.poll() is None, "the kernel process ended before its cluster started"
    _, run_dir, job = line.split()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(3)
    assert job in sge_testbed.jobs(), "the kept job did not outlive the kernel"
    [record] = _keep.kept()
    assert record["job_id"] == job, record
    cluster = Cluster.attach()
    assert cluster.pull("zz") == {0: 7, 1: 7}
    cluster.stop()
    jobs, pids = sge_testbed.leftovers(timeout=20)
    assert job not in jobs and not pids, (jobs, pids)
    assert not os.path.isdir(run_dir)
