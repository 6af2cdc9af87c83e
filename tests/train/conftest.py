"""Fixture ``run_ranks``: run a worker script on real MPI ranks, collect what each reports.

A worker prints ``RESULT {json}`` lines (see ``workers/_report.py``); this helper
runs it under ``mpiexec`` in its own process group and kills the whole group if
it outlives ``timeout``, so a hang fails the test instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clusterkernel.mpiexec import MPIRuntime

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"


def _run_ranks(n: int, worker: str, *args: str, timeout: float = 120) -> dict[int, list[dict]]:
    """Run ``workers/<worker>.py`` on ``n`` ranks; return ``{rank: [result, ...]}``.

    Fails the test (with all output) on a non-zero exit or a timeout.
    """
    rt = MPIRuntime.detect()
    env = rt.env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"  # ranks share 2 cores
    cmd = [*rt.command(n), sys.executable, str(WORKERS / f"{worker}.py"), *args]
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(
            f"{worker} on {n} ranks hung (> {timeout} s)\n--- stdout\n{out}\n--- stderr\n{err}"
        )
    if proc.returncode != 0:
        pytest.fail(
            f"{worker} on {n} ranks exited {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"
        )
    results: dict[int, list[dict]] = {r: [] for r in range(n)}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            rec = json.loads(line[len("RESULT ") :])
            results[rec["rank"]].append(rec)
    return results


@pytest.fixture(scope="session")
def run_ranks():
    """``run_ranks(n, worker, *args, timeout=...) -> {rank: [result, ...]}``."""
    return _run_ranks
