"""The README's first command ends in `clusterkernel-quickstart`: run it for real."""

from __future__ import annotations

import subprocess
import sys

from clusterkernel.client.quickstart import next_step
from tests._labels import per_rank_lines
from tests._procs import wait_no_cluster_processes


def test_quickstart_runs_in_a_terminal(no_shared_cluster):
    proc = subprocess.run(
        [sys.executable, "-m", "clusterkernel.client.quickstart", "-n", "3"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "Started 3 MPI ranks" in out
    lines = per_rank_lines(out)
    # (rank order holds for lines that arrive within the terminal's hold; not asserted
    # here, where the ranks' timing is the machine's: tests/cluster/test_output_*.py)
    assert [(r, f"hello from rank {r} of 3") for r in range(3)] == sorted(
        line for line in lines if line[1].startswith("hello")
    )
    summed = [r for r, text in lines if text == "sum of ranks on every rank: [3.0, 3.0, 3.0]"]
    assert sorted(summed) == [0, 1, 2]
    assert "{0: 42, 1: 43, 2: 44}" in out
    assert "[rank 1] error: ValueError: odd rank 1 says no" in out
    assert "Stopped all MPI ranks." in out
    # a pip user has no notebooks/ folder: the last line names the command that copies
    # them out of the package and opens JupyterLab, by this venv's paths
    # (tests/test_notebooks_command.py runs it as printed)
    assert out.splitlines()[-1].strip() == next_step(), out
    assert not wait_no_cluster_processes(20)
