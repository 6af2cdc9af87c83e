"""Run a teaching notebook top to bottom in a fresh kernel, as CI and the storing script do.

Both the tests (``test_notebooks.py``) and ``python -m tests.notebooks.store`` call
:func:`execute`, so what is stored is what the tests run: a real ``python3`` kernel,
the notebook's own ``%mpi start`` (real MPI ranks), in a temporary directory with the
other notebooks beside it (notebook 08 exports 03). Figures are drawn at
:data:`FIGURE_DPI` so the stored pictures stay small.

Example::

    nb = execute(NOTEBOOKS[0], Path(tempfile.mkdtemp()))
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from clusterkernel.client.launch._run_dir import RUN_ROOT_ENV
from tests._procs import wait_no_cluster_processes

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
# every numbered notebook in the folder, a new one included
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
SLURM_NOTEBOOK = NOTEBOOK_DIR / "08_beyond_one_machine.ipynb"
CELL_TIMEOUT = 240  # seconds; a hang guard only: the notebooks take seconds per cell
CHECKED = "all checks passed"
FIGURE_DPI = 80  # matplotlib's default is 100; GitHub shows notebooks ~900 px wide


def code_cells(nb) -> list:
    """The notebook's code cells, in order."""
    return [c for c in nb.cells if c.cell_type == "code"]


def output_text(output) -> str:
    """The text of one output: a stream's text, else its ``text/plain``."""
    if output.get("output_type") == "stream":
        return output["text"]
    return output.get("data", {}).get("text/plain", "")


def execute(path: Path, workdir: Path, env: dict[str, str] | None = None):
    """Run ``path`` top to bottom in a fresh kernel in ``workdir``; return the notebook.

    Raises ``CellExecutionError`` (with the traceback) on any failing cell, and
    ``AssertionError`` if the check cell printed nothing or cluster processes are left.
    ``env=None``: the kernel inherits ``os.environ``. Either way its clusters keep their
    run directories under ``workdir`` (``%mpi list`` shows what the notebook kept, never
    a user's own kept clusters).
    """
    for sibling in NOTEBOOKS:
        shutil.copy(sibling, workdir)
    nb = nbformat.read(path, as_version=4)
    for cell in code_cells(nb):  # the stored outputs are compared, never reused
        cell.outputs, cell.execution_count = [], None
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
        extra_arguments=[f"--InlineBackend.rc={{'figure.dpi': {FIGURE_DPI}}}"],
        record_timing=False,  # no timestamps in the cells' metadata
        store_widget_state=False,  # live widget models GitHub cannot show
    )
    started = time.monotonic()
    runs = workdir / "runs"
    runs.mkdir(mode=0o755, exist_ok=True)  # the run directories inside are private
    client.execute(env={**(os.environ if env is None else env), RUN_ROOT_ENV: str(runs)})
    print(f"{path.name}: {time.monotonic() - started:.1f} s")
    outputs = "".join(output_text(o) for c in code_cells(nb) for o in c.outputs)
    assert CHECKED in outputs, f"{path.name} ran but its check cell printed nothing"
    left = wait_no_cluster_processes(30)
    assert not left, f"{path.name} left processes behind: {[p.cmdline() for p in left]}"
    return nb
