"""Fixture ``run_ranks``: run a worker script on real MPI ranks, collect what each reports.

A worker prints ``RESULT {json}`` lines (see ``tests/_results.py``); the job runs
through :func:`tests._mpirun.run_mpi`, so a failure or a hang fails the test with
all the output instead of hanging the suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._mpirun import run_mpi
from tests._results import by_rank, parse_results

WORKERS = Path(__file__).resolve().parent / "workers"


def _run_ranks(n: int, worker: str, *args: str, timeout: float = 120) -> dict[int, list[dict]]:
    """Run ``workers/<worker>.py`` on ``n`` ranks; return ``{rank: [result, ...]}``."""
    out = run_mpi(n, str(WORKERS / f"{worker}.py"), *args, timeout=timeout).stdout
    return by_rank(parse_results(out), n)


@pytest.fixture(scope="session")
def run_ranks():
    """``run_ranks(n, worker, *args, timeout=...) -> {rank: [result, ...]}``."""
    return _run_ranks
