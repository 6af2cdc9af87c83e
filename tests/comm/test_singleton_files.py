"""A process using comm without mpiexec (an MPI "singleton") leaves nothing in /dev/shm.

Open MPI 5 gives every process a 16 MB shared-memory segment in /dev/shm, which
mpiexec's daemon removes when the job ends; a singleton has no daemon, so without
comm's exit hook each run left one behind. Only names carrying the process's own
job identity are looked at (other jobs may have files there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterkernel.protocol._shm_names import SHM_DIR

REPO = Path(__file__).resolve().parents[2]
CODE = """
import json, torch
from clusterkernel import comm
from clusterkernel.protocol._shm_names import job_prefixes
comm.all_reduce(torch.ones(4), algorithm="shm")
print(json.dumps(job_prefixes()))
"""

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="needs /dev/shm")


def test_singleton_leaves_no_segment_behind():
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    prefixes = json.loads(out.stdout.strip().splitlines()[-1])
    assert prefixes, "the process mapped no Open MPI file: the check would prove nothing"
    left = [n for n in os.listdir(SHM_DIR) if n.startswith(tuple(prefixes))]
    assert not left, f"left in {SHM_DIR} by a singleton run: {left}"
