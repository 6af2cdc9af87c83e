"""``clusterkernel export`` and the options it shares with ``%mpi export`` (client side).

The job-file options are declared once here (:data:`JOB_FILES`,
:data:`SBATCH_OPTIONS`, :data:`PROFILE_OPTION`) for both parsers, and picked by name
from either's parsed options (:func:`job_args`); :func:`read_notebook` reads an
``.ipynb`` file's cells. Re-exported by :mod:`clusterkernel.client.export`.

Example::

    clusterkernel export train.ipynb -o job.py --sbatch job.sbatch --nodes 2
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import NamedTuple

from clusterkernel.client import scheduler
from clusterkernel.client.export._cellcode import ExportError
from clusterkernel.client.export._jobfile import _exporters, job_ranks, write_job, written_text
from clusterkernel.client.export._profilecode import PROFILE_KINDS


def _export_options() -> tuple[tuple[str, dict], ...]:
    """Each scheduler option that shapes an exported job file, once (flag, argparse
    keywords), its help naming the schedulers that take it."""
    return tuple(scheduler.arguments("export"))


# The options of %mpi export and of clusterkernel export that shape the job files,
# declared once for both parsers (flag, argparse keywords): the job files (one flag per
# scheduler), then the schedulers' options, then --profile; EXPORT_ARGS: their names
JOB_FILES: tuple[tuple[str, dict], ...] = tuple(
    (system.export_flag, {"help": f"also write a {system.title} job file here"})
    for _, system in _exporters()
)
SBATCH_OPTIONS: tuple[tuple[str, dict], ...] = _export_options()
# --profile: the job profiles every rank (the job's own option, not a scheduler's)
PROFILE_OPTION: tuple[tuple[str, dict], ...] = (
    (
        "--profile",
        {
            "nargs": "?",
            "const": "python",
            "choices": PROFILE_KINDS,
            "help": "sample every rank's Python stacks over the job; at its end rank 0 writes "
            "<job>.speedscope.json and <job>.trace.json (Perfetto) beside it; torch: "
            "torch.profiler's CPU ops too",
        },
    ),
)
EXPORT_ARGS = (
    tuple(kw["dest"] for _, kw in SBATCH_OPTIONS)
    + tuple(flag[2:].replace("-", "_") for flag, _ in JOB_FILES)
    + ("profile",)
)


def job_args(args: argparse.Namespace) -> dict:
    """The job-file options (and ``--profile``) of ``%mpi export``'s or ``clusterkernel
    export``'s parsed options, as :func:`write_job` takes them: picked once, by name, for both.

    Example::

        write_job(cells, "job.py", **job_args(args))   # sbatch=..., qsub=..., nodes=...
    """
    return {name: getattr(args, name) for name in EXPORT_ARGS}


sbatch_args = job_args  # its name before Grid Engine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``clusterkernel export``."""
    parser.add_argument("notebook", help="the .ipynb file")
    parser.add_argument("-o", "--output", help="script to write (default: notebook name, .py)")
    for flag, options in JOB_FILES + SBATCH_OPTIONS + PROFILE_OPTION:
        parser.add_argument(flag, **options)
    parser.add_argument(
        "--include-failed",
        action="store_true",
        help="keep cells whose stored outputs hold an error (default: left out, with a comment)",
    )


class NotebookCells(NamedTuple):
    """What an exported notebook file holds: its code cells, the MPI kernel's ranks and
    group (None/False for other kernels), and the cells whose stored outputs hold an error."""

    cells: list[str]
    ranks: int | None
    torch: bool
    failed: set[int]


def read_notebook(path: str | Path) -> NotebookCells:
    """An nbformat-4 notebook's code cells, its ranks if it is the MPI kernel's, whether
    that kernel starts its ranks with torch.distributed's default group, and which cells
    failed when it last ran.

    A notebook of the MPI kernel ("Python 3 (MPI, 4 ranks)") runs every cell on the ranks.
    """
    try:
        data = json.loads(Path(path).read_text())
        code = [c for c in data["cells"] if c.get("cell_type") == "code"]
        sources = [c["source"] for c in code]
        failed = {
            i
            for i, c in enumerate(code)
            if any(o.get("output_type") == "error" for o in c.get("outputs") or [])
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ExportError(f"cannot read {path} as an nbformat 4 notebook: {e}") from None
    spec = str(data.get("metadata", {}).get("kernelspec"))
    kernel = re.search(r"\(MPI, (\d+) ranks?(, torch\.distributed)?\)", spec)
    cells = ["".join(src) if isinstance(src, list) else src for src in sources]
    if not kernel:
        return NotebookCells(cells, None, False, failed)
    return NotebookCells(cells, int(kernel.group(1)), bool(kernel.group(2)), failed)


def main(args: argparse.Namespace) -> int:
    """``clusterkernel export notebook.ipynb -o job.py [--sbatch job.sbatch | --qsub job.qsub]``."""
    nb = Path(args.notebook)
    try:
        cells, kernel_ranks, kernel_torch, failed = read_notebook(nb)
        names = [f"code cell {i}" for i in range(1, len(cells) + 1)]
        job = job_args(args)
        written = write_job(
            cells,
            Path(args.output or nb.with_suffix(".py")),
            names=names,
            source=nb.name,
            ranks=kernel_ranks,
            auto=kernel_ranks is not None,
            torch=(True, None) if kernel_torch else None,
            failed=set() if args.include_failed else failed,
            **job,
        )
    except ExportError as e:
        print(f"clusterkernel export: {e}", file=sys.stderr)
        return 2
    print(written_text(written, job_ranks(cells, kernel_ranks), job))
    return 0
