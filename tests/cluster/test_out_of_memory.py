"""A rank the kernel's out-of-memory killer ends: the cell says so, and nothing is left.

A real OOM kill: the client runs in a memory cgroup of its own with a 1.2 GB limit (its
mpiexec and ranks inherit it) and rank 1 allocates past it. The cell's error names
rank 1 and "out of memory", Open MPI's raw notice is not passed through, and after
``stop()`` no process of the cgroup and none of the job's /dev/shm files remain.
Needs a writable memory cgroup (root, cgroup v1 or v2), as on the test machines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

LIMIT = 1200 * 2**20

SCRIPT = textwrap.dedent(
    """
    import glob, json, os
    from clusterkernel import Cluster, RankError
    cluster = Cluster(n=2, timeout=120).start()
    run_dir = cluster.run_dir
    try:
        cluster.run(
            "import numpy as np\\nfrom mpi4py import MPI\\n"
            "if MPI.COMM_WORLD.rank == 1:\\n"
            "    hog = [np.ones(2**27) for _ in range(20)]\\n"  # 20 GiB, 1 GiB at a time
            "MPI.COMM_WORLD.Barrier()\\n"
        )
        error = "no error"
    except RankError as e:
        error = "\\n".join(e.render(color=False))
    prefixes = []
    for note in glob.glob(os.path.join(run_dir, "shm-names-rank*.txt")):
        prefixes += open(note).read().split()
    cluster.stop()
    left = [n for n in os.listdir("/dev/shm") if n.startswith(tuple(prefixes))]
    print(json.dumps({"error": error, "prefixes": prefixes, "left": left}))
    """
)


def _memory_cgroup() -> tuple[Path, str] | None:
    """A new child of this process's memory cgroup, and the file that sets its limit."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            parent, limit = Path("/sys/fs/cgroup/memory", path.lstrip("/")), "memory.limit_in_bytes"
            break
        if hierarchy == "0" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            parent, limit = Path("/sys/fs/cgroup", path.lstrip("/")), "memory.max"
            break
    else:
        return None
    child = parent / f"ck-oom-{uuid.uuid4().hex[:8]}"
    try:
        child.mkdir()
    except OSError:
        return None
    return child, limit


@pytest.fixture
def small_cgroup():
    made = _memory_cgroup()
    if made is None:
        pytest.skip("no writable memory cgroup here")
    child, limit = made
    (child / limit).write_text(str(LIMIT))
    swap = child / "memory.memsw.limit_in_bytes"  # v1 with swap accounting: no swap either
    if swap.exists():
        swap.write_text(str(LIMIT))
    yield child
    child.rmdir()  # fails (and so does the test) if a process of it were still alive


def test_a_rank_killed_for_memory_is_named_and_leaves_nothing(small_cgroup, no_shared_cluster):
    # no_shared_cluster: the script below starts a cluster of its own (one at a time)
    procs = small_cgroup / "cgroup.procs"

    def enter_cgroup() -> None:
        procs.write_text(str(os.getpid()))

    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        preexec_fn=enter_cgroup,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    result = json.loads(done.stdout.strip().splitlines()[-1])
    error = result["error"]
    assert "rank 1" in error and "out of memory" in error, error
    assert "noticed that process rank" not in error, error  # Open MPI's notice is folded
    assert "rank 0" in error and "stopped by mpiexec" in error, error
    assert result["prefixes"], "the ranks noted no /dev/shm names"
    assert result["left"] == [], result
    assert procs.read_text().split() == []
