"""Run a worker script of ``workers/`` on real ranks and collect its RESULT lines."""

from __future__ import annotations

from pathlib import Path

from tests._mpirun import MPIRun, run_mpi
from tests._results import by_scenario, parse_results

WORKERS = Path(__file__).resolve().parent / "workers"


def results(run: MPIRun) -> dict[str, dict[int, dict]]:
    """``{scenario: {rank: result}}`` from a job's output."""
    return by_scenario(parse_results(run.stdout))


def run_worker(n: int, worker: str, *args: str, timeout: float = 180, **kw) -> MPIRun:
    """``workers/<worker>.py`` on ``n`` ranks (see :func:`tests._mpirun.run_mpi`)."""
    return run_mpi(n, str(WORKERS / f"{worker}.py"), *args, timeout=timeout, **kw)
