"""Run the comm case files on 1, 2, 3 and 4 real MPI ranks.

Each case file under ``mpi/`` is a pytest module executed by every rank inside one
``mpiexec`` job; this outer test asserts the job passed and shows every rank's
output otherwise. ``tests._mpirun.run_mpi`` kills the whole job if it outlives its
timeout, so a hang fails instead of blocking the suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._mpirun import run_case_files

HERE = Path(__file__).resolve().parent
TIMEOUT = 240


def run_cases(n: int, *pytest_args: str) -> str:
    return run_case_files(n, HERE / "mpi", *pytest_args, timeout=TIMEOUT)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_comm_cases_on_n_ranks(n):
    out = run_cases(n, ".")
    # Every rank ran the cases (pytest's summary line per rank), none was skipped.
    assert out.count(" passed") >= n, out
