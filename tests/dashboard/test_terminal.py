"""``%%mpi --dashboard`` in a terminal IPython: tqdm lines per rank, a summary at the end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests._procs import wait_no_cluster_processes
from tests.dashboard._cells import train_cell

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
from IPython.terminal.interactiveshell import TerminalInteractiveShell
shell = TerminalInteractiveShell.instance()
for cell in CELLS:
    result = shell.run_cell(cell)
    if not result.success:
        sys.exit(f"cell failed: {cell[:40]!r}")
"""


def test_terminal_progress_per_rank_and_summary(no_shared_cluster):
    cells = ["%load_ext clusterkernel", "%mpi start -n 2", train_cell(2), "%mpi stop"]
    proc = subprocess.run(
        [sys.executable, "-c", f"CELLS = {cells!r}\n{SCRIPT}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # tqdm: one line per rank, counting steps, with the loss
    for rank in (0, 1):
        assert f"rank {rank}: " in proc.stderr, proc.stderr
    assert "64step" in proc.stderr.replace(" ", "") and "loss=" in proc.stderr
    lines = proc.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["rank", "steps"])
    rows = [lines[head + 1].split(), lines[head + 2].split()]
    # per rank: all 64 steps of the Trainer (the user's 20 accuracy logs are not loss)
    assert [r[:2] for r in rows] == [["0", "64"], ["1", "64"]]
    assert float(rows[0][3]) < float(rows[0][2])  # the loss went down
    assert any("all_reduce" in ln for ln in lines[head:])
    left = wait_no_cluster_processes(30)
    assert not left, f"left behind: {[p.cmdline() for p in left]}"
