"""Run a Python script or a pytest module on real MPI ranks from a test.

One place for what every MPI test needs: the ``mpiexec`` of
:class:`clusterkernel.client.mpiexec.MPIRuntime` with its environment, the repository on
``PYTHONPATH``, one OpenMP thread per rank (ranks share the cores), and a timeout.
The job runs in its own session, and on a timeout every process of that session
(mpiexec, its daemons and every rank) is killed: a hang fails the test instead of
blocking the suite or leaving ranks behind. A non-zero exit or a timeout fails the test with all the job's output.

Example::

    from tests._mpirun import run_mpi

    out = run_mpi(2, "worker.py", "--steps", "3").stdout            # a script
    run_mpi(4, "-m", "pytest", "-q", "case_x.py", cwd=here, timeout=240)  # pytest
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from clusterkernel.client.mpiexec import MPIRuntime

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class MPIRun:
    """What a finished job printed: ``stdout`` and ``stderr`` (all ranks interleaved)."""

    stdout: str
    stderr: str


def kill_session(sid: int) -> None:
    # Not killpg: Open MPI starts each rank in a process group of its own, so only
    # the session (which the ranks keep) names all of the job's processes.
    for pid in psutil.pids():
        try:
            if os.getsid(pid) == sid:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue


def run_session(
    cmd: list[str],
    *,
    what: str,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """Run ``cmd`` to its end in a session of its own; its status and output (text).

    Where it outlives ``timeout`` seconds, every process of its session (mpiexec, its
    daemons, every rank) is killed and the calling test fails, saying ``what`` hung and
    what it printed: a hang never blocks the suite or leaves ranks behind.

    Example: ``proc = run_session(["bash", "-c", line], what=line, cwd=tmp_path)``.
    """
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Own session: kill_session reaches mpiexec's daemons and ranks, not pytest.
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"{what} hung (> {timeout} s)\n--- stdout\n{out}\n--- stderr\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_mpi(
    n: int,
    *python_args: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    tag_output: bool = False,
    fault_tolerant: bool = False,
    hosts: list[tuple[str, int | None]] | None = None,
) -> MPIRun:
    """Run ``python <python_args>`` on ``n`` ranks under ``mpiexec``; return its output.

    ``python_args`` is what follows the interpreter: ``"script.py", "arg"`` or
    ``"-m", "pytest", "case.py"``. ``env`` adds to (and overrides) the runtime's
    environment. ``tag_output`` prefixes every line with its rank (Open MPI's
    ``--tag-output``), which helps read a failure of many ranks. ``fault_tolerant``
    keeps the job alive when a rank dies (see :meth:`MPIRuntime.env`). ``hosts``
    (``[(name, slots), ...]``) places the ranks on those machines.

    Fails the calling test, showing stdout and stderr, if the job exits non-zero or
    outlives ``timeout`` seconds (then every process of the job is killed first).
    """
    rt = MPIRuntime.detect()
    full_env = rt.env(fault_tolerant=fault_tolerant, hosts=hosts)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full_env.get("PYTHONPATH")]))
    full_env["OMP_NUM_THREADS"] = "1"  # ranks share 2 cores; more threads only contend
    full_env.update(env or {})
    tag = ["--tag-output"] if tag_output else []
    cmd = [
        *rt.command(n, fault_tolerant=fault_tolerant, hosts=hosts),
        *tag,
        sys.executable,
        *python_args,
    ]
    what = f"{' '.join(python_args)} on {n} ranks"
    proc = run_session(cmd, what=what, cwd=cwd, env=full_env, timeout=timeout)
    out, err = proc.stdout, proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"{what} exited {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}")
    return MPIRun(out, err)


def run_case_files(n: int, case_dir: Path, *pytest_args: str, timeout: float = 240) -> str:
    """Run the pytest case files (``case_*.py``) of ``case_dir`` on every rank of one
    ``mpiexec -n n`` job; its output. Only ``case_dir``'s own conftest applies (the
    suite's fixtures belong to the client side); a rank stuck past 90 s dumps its stack
    and exits, which ends the job, so a hang fails instead of blocking the suite."""
    return run_mpi(
        n,
        "-m",
        "pytest",
        "-q",
        "--color=no",
        "-x",
        "-p",
        "no:cacheprovider",
        f"--confcutdir={case_dir}",
        "-o",
        "python_files=case_*.py",
        "-o",
        "timeout=90",
        "-o",
        "timeout_method=thread",
        *(pytest_args or (".",)),
        cwd=case_dir,
        tag_output=True,
        timeout=timeout,
    ).stdout
