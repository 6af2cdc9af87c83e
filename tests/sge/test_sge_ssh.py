"""``%mpi start --scheduler sge --ssh login``: a notebook outside the cluster (the login
bed's laptop namespace, which reaches the cluster by SSH to the login node only) starts
2 ranks as a Grid Engine job, runs a cell with a collective on them, stops, and leaves
nothing: no job, no process (on the laptop or the login side), no Open MPI file in
/dev/shm, no network namespace.

The login bed's SSH sessions see the Grid Engine bed's environment (``SGE_ROOT``, ...),
as a login node's profile would set it, and this test session's mark (so the
controller, the guard and the ranks on the login side count as its processes,
tests/_procs.py). The laptop cannot reach the qmaster: ``qsub``, ``qstat`` and ``qdel``
work only as ``ssh login ...``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests._batch_beds import assert_job_gone
from tests._login_bed import LOGIN_BED, laptop_bed
from tests._procs import SESSION, SESSION_VAR, wait_no_cluster_processes
from tests._shm_leaks import segments

pytestmark = pytest.mark.skipif(not LOGIN_BED.exists(), reason="no login test bed")

_NOTEBOOK = """
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic("load_ext", "clusterkernel")
ip.run_line_magic("mpi", "start -n 2 --scheduler sge --ssh login")
cluster = ip.user_ns["cluster"]
print("JOB", cluster.job_id, "RUN_DIR", cluster.run_dir, flush=True)
ip.run_cell_magic("mpi", "", '''
import os, torch
from clusterkernel import comm
t = torch.tensor([comm.rank() + 1.0])
comm.all_reduce(t)
print("rank", comm.rank(), "of", comm.size(), "sum", t.item(), "in job", os.environ["JOB_ID"])
''')
# a cell exported as a Grid Engine job, from a folder under the laptop's home
import os, tempfile
os.chdir(tempfile.mkdtemp(prefix="ck-export-", dir=os.path.expanduser("~")))
ip.run_cell("%%mpi\\nprint('job')", store_history=True)
ip.run_line_magic("mpi", "export job.py --qsub job.qsub")
ip.run_line_magic("mpi", "stop")
print("STOPPED", flush=True)
"""


def test_two_ranks_under_grid_engine_from_outside_then_nothing_left(sge_testbed, no_shared_cluster):
    before = segments()
    with laptop_bed({**sge_testbed.env, SESSION_VAR: SESSION}) as laptop:
        proc = laptop(_NOTEBOOK)
        try:
            out, _ = proc.communicate(timeout=180)
        finally:
            proc.kill()
        assert proc.returncode == 0 and "STOPPED" in out, out
        assert "Started 2 MPI ranks (sge)." in out, out
        job, _, run_dir = out.split("JOB ", 1)[1].split()[:3]
        # both ranks in one MPI world, inside the Grid Engine job the notebook submitted
        assert f"[rank 0] rank 0 of 2 sum 3.0 in job {job}" in out, out
        assert f"[rank 1] rank 1 of 2 sum 3.0 in job {job}" in out, out
        assert "Stopped all MPI ranks." in out, out
        # the export: its qsub file on the login side runs the login node's Python there
        submit = out.split("or submit it:", 1)[1].split("\n", 1)[0].split()
        assert submit[:3] == ["ssh", "login", "qsub"] and len(submit) == 4, out
        folder = Path(submit[3]).parent
        try:
            assert folder.parent == Path(os.path.expanduser("~root")), out
            assert (laptop.home / folder.name / "job.qsub").exists(), out
            assert f"{sys.executable} {folder}/job.py" in (folder / "job.qsub").read_text()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        assert_job_gone(sge_testbed, job)
        left = wait_no_cluster_processes(20)
        assert not left, [p.cmdline() for p in left]
        assert not segments() - before, sorted(segments() - before)
        # the cluster's directory on the login node (under its home) and on the laptop
        remote = Path(os.path.expanduser("~root")) / os.path.relpath(run_dir, laptop.home)
        assert not remote.exists() and not Path(run_dir).exists(), (remote, run_dir)
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert laptop.netns not in namespaces.split(), namespaces
