"""A notebook's ``%%mpi`` cells as a batch job: one Python script and a scheduler's file.

The rank cells (``%%mpi`` cells, and every cell run while ``%mpi on`` was in
effect), in order, become one plain script that every rank runs, under
``python -m clusterkernel run -n N job.py`` (``mpiexec`` with what this machine needs;
the script's first lines give it with absolute paths, runnable as printed), plain
``mpiexec``, ``srun --mpi=pmix python job.py`` (``--sbatch``) or ``qsub`` of a Grid
Engine script (``--qsub``): the scheduler's class writes it
(:meth:`~clusterkernel.client.scheduler.BatchSystem.export_script`); from a notebook
outside the cluster (``%mpi start --ssh login``) the files are the login node's and
are sent there too (:mod:`~clusterkernel.client.export._cluster_side`). Client-only
cells are left out with a comment. ``%mpi push`` values come along: embedded from
the live namespace (``%mpi export`` in the notebook), or, exporting a file,
``push x=expr`` becomes ``x = expr`` and ``push x`` replays the notebook's own
top-level statements that make ``x``. ``--profile`` (``profile="python"``) samples
every rank over the job and writes speedscope and Perfetto files at its end
(:mod:`~clusterkernel.client.export._profilecode`). Client side: never imports mpi4py.

Example::

    from clusterkernel.client.export import export_cells, sbatch_script
    script = export_cells(["x = 3\\n%mpi push x", "%%mpi\\nprint(x)"])
    Path("job.py").write_text(script)                 # clusterkernel run -n 4 job.py
    Path("job.sbatch").write_text(sbatch_script("job.py", nodes=2, ntasks_per_node=4))
"""

from __future__ import annotations

# the work, in named parts: cells to a script, the schedulers' job files, the command.
# Every name the module had is here (the magics and the command line use those outside
# __all__); __all__ is what ``from clusterkernel.export import *`` gives.
from clusterkernel.client.export._cellcode import ExportError
from clusterkernel.client.export._cli import (  # noqa: F401
    EXPORT_ARGS,
    JOB_FILES,
    PROFILE_OPTION,
    SBATCH_OPTIONS,
    NotebookCells,
    add_arguments,
    job_args,
    main,
    read_notebook,
    sbatch_args,
)
from clusterkernel.client.export._cluster_side import cluster_side
from clusterkernel.client.export._jobfile import (
    job_ranks,
    job_script,
    sbatch_script,
    write_job,
    written_text,
)
from clusterkernel.client.export._run_command import add_run_arguments, run_command, run_main
from clusterkernel.client.export._script import (  # noqa: F401
    export_cells,
    live_pushes,
    notebook_ranks,
    push_requests,
    torch_use,
)

__all__ = [
    "ExportError",
    "cluster_side",
    "export_cells",
    "sbatch_script",
    "job_script",
    "write_job",
    "written_text",
    "job_ranks",
    "run_command",
    "live_pushes",
    "add_run_arguments",
    "run_main",
]
