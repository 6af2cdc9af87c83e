"""Ranks as a real Grid Engine job (issue 37 item 2): ``%mpi start --scheduler sge``
submits one job whose ``mpiexec`` takes the job's slots (``$PE_HOSTFILE``), a cell runs
on its 4 ranks, ``%mpi stop`` leaves no job and no process; an exported ``qsub`` script
runs as a job of its own; a kernel killed outright leaves nothing either (the guard
cancels its job); a launcher that crashes mid-cell is named as the launcher, no rank
blamed.

One cluster for the first test (the machine's 2 cores take one at a time); the test
bed is ``sge_testbed`` (tests/conftest.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from clusterkernel import Cluster
from tests._batch_beds import (
    a_kept_job_outlives_its_kernel,
    a_killed_kernel_leaves_nothing,
    assert_job_gone,
    parent_crashed,
    stop_cancels_the_kept_job,
)
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
    # Open MPI's hostfile of the job's slots: in /tmp, as this queue gives no TMPDIR
    hostfile = Path("/tmp", f"clusterkernel-hosts.{job}")
    assert hostfile.exists()
    magics.mpi("stop")
    assert_job_gone(sge_testbed, job)
    assert not hostfile.exists()
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


_SGE = 'n=2, launcher="sge"'


def test_a_killed_kernel_leaves_no_job_and_no_process(sge_testbed, no_shared_cluster):
    a_killed_kernel_leaves_nothing(sge_testbed, _SGE, timeout=30)


def test_a_kept_job_survives_a_killed_kernel_and_stop_after_attach_cancels_it(
    sge_testbed, no_shared_cluster, tmp_path, monkeypatch
):
    kernel, _, cluster = a_kept_job_outlives_its_kernel(sge_testbed, _SGE, monkeypatch, tmp_path)
    stop_cancels_the_kept_job(sge_testbed, kernel, cluster)


def test_a_launcher_that_crashes_in_the_grid_engine_job_is_named_and_nothing_is_left(
    sge_testbed, no_shared_cluster
):
    """The job's mpiexec (prterun, in the background of the job script's sh, for its
    USR2 trap) dies of SIGSEGV mid-cell, leaving no report of its own. sh (dash) writes
    the signal's words when its ``wait`` reaps it (a rank's SIGSEGV makes mpiexec exit
    139 itself, of which sh says nothing), so the user is told the launcher crashed, no
    rank blamed; the job and every process end."""
    cluster = Cluster(n=2, launcher="sge").start()
    job = cluster.job_id
    try:
        error = parent_crashed(cluster, 0, "prterun")
        said = str(error)
        assert [(f.kind, f.ranks) for f in error.failures] == [("stopped", [0, 1])], said
        assert "The launcher's own process ended, not a rank's" in said, said
        crashed = "the launcher (mpiexec) crashed (killed by SIGSEGV)"
        assert cluster.lost and crashed in cluster.lost, (cluster.lost, cluster.job_output(80))
    finally:
        cluster.stop()
    assert_job_gone(sge_testbed, job)
    left = wait_no_cluster_processes(20)
    assert not left, [p.cmdline() for p in left]
