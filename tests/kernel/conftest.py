"""The MPI kernel's kernelspec in a temporary prefix, visible to Jupyter through JUPYTER_PATH."""

from __future__ import annotations

import subprocess
import sys

import pytest

KERNEL = "ck-test"  # a name of its own: never the user's installed "clusterkernel"


@pytest.fixture
def mpi_kernel(tmp_path, monkeypatch, no_shared_cluster) -> str:
    """Install a 2-rank MPI kernelspec with the real command; return its kernel name.

    The session's shared cluster is stopped first: one cluster at a time, and the
    tests count this kernel's processes among the test run's own.
    """
    prefix = tmp_path / "prefix"
    subprocess.run(
        [sys.executable, "-m", "clusterkernel", "install-kernel", "-n", "2",
         "--name", KERNEL, "--prefix", str(prefix)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    return KERNEL
