"""Steps that every batch scheduler's test bed (Slurm, Grid Engine, ...) shares.

A scheduler's suite has a test bed object (``tests/slurm/_testbed.py``,
``tests/sge/_testbed.py``) with ``jobs()`` (the ids the scheduler holds) and
``leftovers(timeout)`` (``(jobs, pids, ...)``: the job ids first, then one list of
leftover processes per node). The steps here take that bed and the scheduler's
``Cluster`` options and do what every scheduler's suite checks: a notebook kernel
that starts a job and is killed outright leaves no job and no process; a kept job
outlives its killed kernel and ``stop()`` after ``Cluster.attach()`` cancels it. A
scheduler added later (PBS, LSF) calls these with its own bed and options.

Example::

    from tests._batch_beds import a_killed_kernel_leaves_nothing

    def test_a_killed_kernel_leaves_no_job_and_no_process(pbs_testbed):
        a_killed_kernel_leaves_nothing(pbs_testbed, 'n=2, launcher="pbs"')
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from clusterkernel import Cluster, RankError
from clusterkernel.client.output import TerminalRenderer

_KERNEL = """
import sys
from clusterkernel import Cluster
c = Cluster({options}).start()
{then}
print("JOB", c.run_dir, c.job_id, flush=True)
sys.stdin.read()
"""


class Bed(Protocol):
    """What the steps need of a scheduler's test bed."""

    def jobs(self) -> list[str]: ...

    def leftovers(self, timeout: float = 20.0) -> tuple[list, ...]: ...


@dataclass
class Kernel:
    """A notebook kernel stand-in (a Python process) that started a cluster as a job."""

    proc: subprocess.Popen
    run_dir: str
    job: str

    def kill(self) -> None:
        """SIGKILL, as a kernel dies when its machine runs out of memory."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def start_kernel(options: str, then: str = "") -> Kernel:
    """A process that runs ``Cluster(options).start()`` (then ``then``) and waits.

    Returns once it printed its cluster's run directory and job id.
    """
    kernel = _KERNEL.format(options=options, then=then)
    proc = subprocess.Popen(
        [sys.executable, "-c", kernel], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    line = ""
    while not line.startswith("JOB"):  # after the live "pending"/"qw" line
        line = proc.stdout.readline().strip("\r\n ").split("\r")[-1].strip()
        assert line or proc.poll() is None, "the kernel process ended before its cluster started"
    _, run_dir, job = line.split()
    return Kernel(proc, run_dir, job)


_PARENT = "import os, psutil\nparent = psutil.Process(os.getppid()).name()\nppid = os.getppid()"
_CRASH_PARENT = """
import os, signal, time
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == {rank}:
    os.kill(os.getppid(), signal.SIGSEGV)
time.sleep(60)
"""


def parent_crashed(cluster: Cluster, rank: int, parent: str) -> RankError:
    """The cell's error after ``rank``'s parent (Open MPI's ``parent``: prted, prterun)
    dies of SIGSEGV mid-cell; the cells' output is not shown."""
    quiet = TerminalRenderer(cluster.ranks, stream=io.StringIO())
    cluster.run(_PARENT, renderer=quiet, timeout=60)
    assert cluster.pull("parent")[rank] == parent
    # Open MPI's session directory of the process crashed here (/tmp/ompi.PID for
    # prterun, /tmp/prted.PID): it removes it itself on a clean end, not on SIGSEGV
    session = Path(
        "/tmp", f"{'ompi' if parent == 'prterun' else parent}.{cluster.pull('ppid')[rank]}"
    )
    try:
        with pytest.raises(RankError) as info:
            cluster.run(_CRASH_PARENT.format(rank=rank), renderer=quiet, timeout=60)
    finally:
        shutil.rmtree(session, ignore_errors=True)
    return info.value


def assert_job_gone(bed: Bed, job: str, timeout: float = 20.0) -> None:
    """Within ``timeout`` the scheduler holds no ``job`` and no job process runs."""
    jobs, *pids = left = bed.leftovers(timeout=timeout)
    assert job not in jobs and not any(pids), left


def assert_run_dir_gone(run_dir: str, timeout: float = 20.0) -> None:
    """Within ``timeout`` the cluster's run directory has been removed."""
    deadline = time.monotonic() + timeout
    while os.path.isdir(run_dir) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not os.path.isdir(run_dir), "the guard left the cluster's run directory"


def a_killed_kernel_leaves_nothing(bed: Bed, options: str, timeout: float = 20.0) -> Kernel:
    """Start a job from a kernel, kill the kernel: the guard cancels the job.

    ``timeout`` is how long the scheduler may take to end the job's processes.
    """
    kernel = start_kernel(options)
    assert kernel.job in bed.jobs() and os.path.isdir(kernel.run_dir)
    kernel.kill()
    assert_job_gone(bed, kernel.job, timeout=timeout)
    assert_run_dir_gone(kernel.run_dir)
    return kernel


def a_kept_job_outlives_its_kernel(bed: Bed, options: str, monkeypatch, tmp_path):
    """A ``keep='10m'`` job whose kernel is killed stays queued and can be attached.

    Returns ``(kernel, keep record, attached cluster)``; the attached cluster pulled
    the value the dead kernel's cell set. Finish with :func:`stop_cancels_the_kept_job`.
    """
    from clusterkernel import Cluster
    from clusterkernel.client.cluster import _kept_records

    monkeypatch.setenv("CLUSTERKERNEL_RUN_DIR", str(tmp_path / "runs"))
    kernel = start_kernel(f"{options}, keep='10m'", then='c.run("zz = 7")')
    kernel.kill()
    time.sleep(3)
    assert kernel.job in bed.jobs(), "the kept job did not outlive the kernel"
    [record] = _kept_records.kept()
    assert record["job_id"] == kernel.job, record
    cluster = Cluster.attach()
    assert cluster.pull("zz") == {0: 7, 1: 7}
    return kernel, record, cluster


def stop_cancels_the_kept_job(bed: Bed, kernel: Kernel, cluster) -> None:
    """``stop()`` of the attached cluster ends the job, its processes and its run dir."""
    cluster.stop()
    assert_job_gone(bed, kernel.job)
    assert not os.path.isdir(kernel.run_dir)
