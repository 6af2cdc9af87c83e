"""Starting and stopping ranks through a real Slurm on two nodes: every way a job
ends leaves nothing in the queue and no process on either node.

Each test starts its own cluster (no other cluster runs meanwhile: the module
of shared-cluster tests has stopped its one by now).
"""

from __future__ import annotations

import _thread
import os
import subprocess
import sys
import threading

import pytest

from clusterkernel import Cluster
from tests._batch_beds import (
    a_kept_job_outlives_its_kernel,
    a_killed_kernel_leaves_nothing,
    assert_job_gone,
    stop_cancels_the_kept_job,
)
from tests._procs import wait_no_cluster_processes


def test_stop_cancels_the_job_and_leaves_nothing_on_either_node(slurm_testbed, _shared_holder):
    cluster = Cluster(n=2, launcher="slurm", nodes=2).start()
    job = cluster.job_id
    cluster.stop()
    assert_job_gone(slurm_testbed, job, timeout=5)


def test_pending_job_is_shown_and_an_interrupt_cancels_it(slurm_testbed, capsys):
    env = {**os.environ}
    blocker = subprocess.run(
        ["sbatch", "--parsable", "-N2", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 300"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.strip()
    try:
        timer = threading.Timer(6.0, _thread.interrupt_main)
        timer.start()
        cluster = Cluster(n=2, launcher="slurm", nodes=2)
        with pytest.raises(KeyboardInterrupt):
            cluster.start()
        timer.cancel()
        out = capsys.readouterr().out
        assert "pending (Resources)" in out or "pending (Priority)" in out, out
        assert not cluster.running
        jobs = [j for j in slurm_testbed.jobs() if j != blocker]
        assert not jobs, f"the interrupted start left job(s) {jobs} in the queue"
    finally:
        subprocess.run(["scancel", blocker], env=env)
    jobs, on1, on2 = slurm_testbed.leftovers()
    assert not jobs and not on1 and not on2, (jobs, on1, on2)


_SLURM = 'n=2, launcher="slurm", nodes=2'


def test_a_killed_notebook_kernel_leaves_no_job_and_no_process(slurm_testbed):
    a_killed_kernel_leaves_nothing(slurm_testbed, _SLURM)


def test_a_kept_job_survives_a_killed_kernel_and_stop_after_attach_cancels_it(
    slurm_testbed, tmp_path, monkeypatch
):
    kernel, record, cluster = a_kept_job_outlives_its_kernel(
        slurm_testbed, _SLURM, monkeypatch, tmp_path
    )
    assert record["where"].startswith(f"Slurm job {kernel.job}"), record
    assert sorted(row["host"] for row in cluster.status()) == ["node1", "node2"]
    stop_cancels_the_kept_job(slurm_testbed, kernel, cluster)


_IN_ALLOCATION = """
from clusterkernel import Cluster
with Cluster() as c:
    print("RESULT", c.n, c.launcher.kind, sorted((r["rank"], r["host"]) for r in c.status()))
"""


def test_inside_an_allocation_start_uses_its_tasks_and_nodes(slurm_testbed):
    done = subprocess.run(
        ["salloc", "-N2", "--ntasks-per-node=2", sys.executable, "-c", _IN_ALLOCATION],
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, done.stdout + done.stderr
    assert line == "RESULT 4 slurm [(0, 'node1'), (1, 'node1'), (2, 'node2'), (3, 'node2')]"
    jobs, on1, on2 = slurm_testbed.leftovers()
    assert not jobs and not on1 and not on2, (jobs, on1, on2)


@pytest.fixture(autouse=True)
def _nothing_left_here():
    """The controller, guard and launcher run on this machine: none may outlive a test."""
    yield
    left = wait_no_cluster_processes(20)
    assert not left, [p.cmdline() for p in left]
