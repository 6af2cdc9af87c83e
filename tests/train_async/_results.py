"""Run a worker script of ``workers/`` on real ranks and collect its RESULT lines."""

from __future__ import annotations

import json
from pathlib import Path

from tests._mpirun import MPIRun, run_mpi

WORKERS = Path(__file__).resolve().parent / "workers"


def results(run: MPIRun) -> dict[str, dict[int, dict]]:
    """``{scenario: {rank: result}}`` from a job's output."""
    out: dict[str, dict[int, dict]] = {}
    for line in run.stdout.splitlines():
        if line.startswith("RESULT "):
            rec = json.loads(line[len("RESULT ") :])
            out.setdefault(rec["scenario"], {})[rec["rank"]] = rec
    return out


def run_worker(n: int, worker: str, *args: str, timeout: float = 180, **kw) -> MPIRun:
    """``workers/<worker>.py`` on ``n`` ranks (see :func:`tests._mpirun.run_mpi`)."""
    return run_mpi(n, str(WORKERS / f"{worker}.py"), *args, timeout=timeout, **kw)
