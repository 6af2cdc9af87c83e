"""The rank side of torch.distributed support under plain ``mpiexec -n 1..4``.

Each case file under ``mpi/`` runs on every rank of one job (as tests/comm does).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._mpirun import run_case_files

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("n", [1, 2, 4])
def test_torchrun_cases_on_n_ranks(n):
    out = run_case_files(n, HERE / "mpi")
    assert out.count(" passed") >= n, out
    assert "skipped" not in out or "GPUs" in out, out
