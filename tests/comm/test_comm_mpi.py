"""Run the comm case files on 1, 2, 3 and 4 real MPI ranks.

Each case file under ``mpi/`` is a pytest module executed by every rank inside one
``mpiexec`` job; this outer test asserts the job passed, shows every rank's output
otherwise, and kills the job's whole process group if it outlives its timeout so a
hang fails instead of blocking the suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clusterkernel.mpiexec import MPIRuntime

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TIMEOUT = 240


def run_cases(n: int, *pytest_args: str, env_extra: dict[str, str] | None = None) -> str:
    rt = MPIRuntime.detect()
    env = rt.env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"  # ranks share the cores
    env.update(env_extra or {})
    cmd = [
        *rt.command(n),
        "--tag-output",
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "--color=no",
        "-x",
        "-p",
        "no:cacheprovider",
        # Only mpi/'s own conftest: the suite's fixtures belong to the client side.
        f"--confcutdir={HERE / 'mpi'}",
        "-o",
        "python_files=case_*.py",
        # A rank stuck past this dumps its stack and exits, which ends the job.
        "-o",
        "timeout=90",
        "-o",
        "timeout_method=thread",
        *pytest_args,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=HERE / "mpi",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"comm cases on {n} ranks hung (> {TIMEOUT} s)\n{out}")
    if proc.returncode != 0:
        pytest.fail(f"comm cases on {n} ranks exited {proc.returncode}\n{out}")
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_comm_cases_on_n_ranks(n):
    out = run_cases(n, ".")
    # Every rank ran the cases (pytest's summary line per rank), none was skipped.
    assert out.count(" passed") >= n, out
