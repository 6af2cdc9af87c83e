"""The schedulers' job files of an exported job, and :func:`write_job` (client side).

:func:`job_script` asks a scheduler's class for its file
(:meth:`~clusterkernel.client.scheduler.BatchSystem.export_script`);
:func:`sbatch_script` is Slurm's; :func:`write_job` writes the script
(:func:`~clusterkernel.client.export._script.export_cells`) and each job file asked
for. Re-exported by :mod:`clusterkernel.client.export`.

Example::

    write_job(cells, "job.py", sbatch="job.sbatch", nodes=2)   # [job.py, job.sbatch]
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Collection
from pathlib import Path, PurePosixPath

from clusterkernel.client import scheduler
from clusterkernel.client.export._cellcode import ExportError
from clusterkernel.client.export._cluster_side import ClusterSide
from clusterkernel.client.export._run_command import run_command
from clusterkernel.client.export._script import export_cells, notebook_ranks
from clusterkernel.client.mpiexec import QUIET_OSC, MPINotFoundError, find_mpiexec
from clusterkernel.client.profile._kinds import ProfileKind
from clusterkernel.client.scheduler import DEFAULT_TIME


def job_script(
    launcher: str,
    script: str | Path,
    n: int,
    *,
    job_name: str | None = None,
    python: str | None = None,
    side: ClusterSide | None = None,
    **options,
) -> str:
    """The job file of scheduler ``launcher`` (``"slurm"``, ``"sge"``) that runs ``script``
    on ``n`` ranks; ``options`` are that scheduler's (others are ignored).

    Uses this Python (``sys.executable``) and the script's absolute path; the job's
    output goes to ``<script stem>-<jobid>.out`` beside the script. With ``side`` (a
    notebook outside the cluster) the job is the login node's: its Python, its
    ``mpiexec`` and the script's path there (:class:`ClusterSide`). A bad value is an
    :class:`ExportError` saying what to give, as ``%mpi start`` says it.

    Example::

        from pathlib import Path
        from clusterkernel.client.export import job_script
        Path("job.qsub").write_text(job_script("sge", "job.py", 4, queue="all.q"))
    """
    path = PurePosixPath(side.path(script)) if side is not None else Path(script).resolve()
    python = side.python if side is not None else python
    system = scheduler.get(launcher)
    mine = {o.name for o in system.options}
    try:
        job = system(n, {k: v for k, v in options.items() if k in mine})
        mpiexec = "mpiexec"
        if system.launch == "mpiexec" and side is not None:
            mpiexec = side.mpiexec()
        elif system.launch == "mpiexec":
            try:
                mpiexec = find_mpiexec()  # the one beside this Python: the same MPI
            except MPINotFoundError:
                pass
        return job.export_script(
            f"{shlex.quote(python or sys.executable)} {shlex.quote(str(path))}",
            job_name=job_name or path.stem,
            output=job.export_output(str(path)),
            mpiexec=mpiexec,
            preamble=[
                "",
                "# Written by clusterkernel export: one MPI rank per task, run by the Python that",
                "# exported the notebook, so the job has the same packages.",
                "set -e",
                "# Quiets a false Open MPI error per shared-memory window (open-mpi/ompi#14086).",
                *(f'export {k}="${{{k}:-{v}}}"' for k, v in QUIET_OSC.items()),
            ],
        )
    except ValueError as e:
        raise ExportError(str(e)) from None


def sbatch_script(
    script: str | Path,
    nodes: int = 1,
    ntasks_per_node: int = 4,
    time: str | None = DEFAULT_TIME,
    partition: str | None = None,
    account: str | None = None,
    job_name: str | None = None,
    python: str | None = None,
    gpus_per_node: int | None = None,
    gres: str | None = None,
) -> str:
    """An sbatch file that runs ``script`` with ``srun --mpi=pmix`` on nodes x tasks ranks
    (:func:`job_script` for Slurm).

    ``gpus_per_node`` / ``gres`` ask Slurm for GPUs (``--gpus-per-node``, ``--gres``).
    The ``#SBATCH`` lines, their defaults (``time`` 01:00:00) and their checks are
    :class:`~clusterkernel.client.scheduler._slurm.SbatchOptions`, the same as
    ``%mpi start --slurm``'s; a bad value is an :class:`ExportError` saying what to give.

    Example::

        Path("job.sbatch").write_text(sbatch_script("job.py", nodes=2, ntasks_per_node=4))
    """
    n = nodes * ntasks_per_node if _counts(nodes, ntasks_per_node) else 1
    return job_script(
        "slurm", script, n, job_name=job_name, python=python, nodes=nodes,
        ntasks_per_node=ntasks_per_node, time=time, partition=partition, account=account,
        gpus_per_node=gpus_per_node, gres=gres,
    )  # fmt: skip


def _counts(*values: object) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)


def write_job(
    cells: list[str],
    path: str | Path,
    *,
    pushed: dict | None = None,
    names: list[str] | None = None,
    source: str = "a notebook",
    ranks: int | None = None,
    auto: bool = False,
    torch: tuple[bool, str | None] | None = None,
    failed: Collection[int] = (),
    nodes: int = 1,
    ntasks_per_node: int | None = None,
    profile: ProfileKind | None = None,
    gpus: tuple[int | None, bool] | None = None,
    side: ClusterSide | None = None,
    **job,
) -> list[Path]:
    """Write the script (and each scheduler's job file asked for); the paths written.

    ``job``: a file per scheduler by its export flag (``sbatch="job.sbatch"``,
    ``qsub="job.qsub"``) and the schedulers' options (:func:`job_args`). A Slurm job has
    ``ntasks_per_node`` (default: the notebook's ranks, ``ranks``, else its ``%mpi start
    -n``, else 4, spread over ``nodes``) per node; another scheduler's, the ranks.
    ``profile``, ``gpus``: as :func:`export_cells` (``--profile``; the ranks' GPU binding).
    ``side``: the login node of a cluster run from outside (:func:`cluster_side`): the
    files are written for it (its Python, its paths) and sent there as well, each to
    the same place under its home as here under this one.
    """
    path = Path(path)
    ranks = job_ranks(cells, ranks)
    text = export_cells(
        cells,
        pushed,
        names=names,
        source=source,
        script_name=side.path(path) if side is not None else str(path.resolve()),
        ranks=ranks,
        auto=auto,
        torch=torch,
        failed=failed,
        profile=profile,
        gpus=gpus,
        python=side.python if side is not None else None,
    )
    files = {name: job.pop(_file_dest(system), None) for name, system in _exporters()}
    written: list[tuple[Path, str]] = []
    for name, target in files.items():
        if target is None:
            continue
        if name == "slurm":
            per_node = ntasks_per_node or math.ceil(ranks / max(nodes, 1))
            options = {**job, "nodes": nodes, "ntasks_per_node": per_node}
            n = nodes * per_node if _counts(nodes, per_node) else 1
        else:
            options, n = job, ranks
        written.append((Path(target), job_script(name, path, n, side=side, **options)))
    path.write_text(text)
    for target, body in written:
        target.write_text(body)
    if side is not None:
        for target, body in [(path, text), *written]:
            side.send(target, body)
    return [path, *(target for target, _ in written)]


def job_ranks(cells: list[str], ranks: int | None = None) -> int:
    """The ranks an exported job runs on: ``ranks`` (the live cluster's), else the cells'
    ``%mpi start -n``, else 4."""
    return ranks or notebook_ranks(cells) or 4


def written_text(
    written: list[Path], ranks: int, job: dict | None = None, side: ClusterSide | None = None
) -> str:
    """What an export prints: the files written, the command that runs the job here, and
    the one that submits each scheduler's file ``job`` names (``sbatch="job.sbatch"``, as
    :func:`write_job` takes them). With ``side`` (:func:`write_job`'s) the commands run
    them on the login node, as typed here: ``ssh login sbatch /home/me/job.sbatch``.

    Example::

        from pathlib import Path
        from clusterkernel.client.export import written_text
        job = {"sbatch": "job.sbatch"}
        print(written_text([Path("job.py"), Path("job.sbatch")], 4, job))
        # Wrote job.py, job.sbatch
        # Run it on 4 ranks:  /opt/venv/bin/python -m clusterkernel run -n 4 /home/me/job.py
        #   or submit it:     sbatch job.sbatch
    """
    lines = ["Wrote " + ", ".join(map(str, written))]
    if side is None:
        lines.append(f"Run it on {ranks} ranks:  {run_command(ranks, Path(written[0]).resolve())}")
    else:
        there = [side.path(p) for p in written]
        lines.append(f"  and on {side.login.host}: " + ", ".join(there))
        run = shlex.split(run_command(ranks, there[0], side.python))
        lines.append(f"Run it on {ranks} ranks:  {side.command(*run)}")
    for _, system in _exporters():
        target = (job or {}).get(_file_dest(system))
        if target is not None and system.submit_command:
            if side is not None:
                submit = side.command(system.submit_command[0], side.path(target))
            else:
                submit = shlex.join([system.submit_command[0], str(target)])
            lines.append(f"  or submit it:     {submit}")
    return "\n".join(lines)


def _exporters():
    """The schedulers a job file can be exported for, with their flag (``--sbatch``)."""
    return [(n, s) for n, s in scheduler.schedulers().items() if s.export_flag]


def _file_dest(system) -> str:
    return system.export_flag[2:].replace("-", "_")
