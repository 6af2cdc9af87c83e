"""Every teaching notebook runs top to bottom in a fresh kernel against real MPI ranks,
and gives the outputs stored with it.

Each notebook starts its own cluster (so the shared one is stopped first), computes
something, checks it in a final assert cell (printing ``all checks passed``) and stops
its ranks with ``%mpi stop``. A failing assert or any unexpected error fails the test
with the cell's traceback; afterwards no cluster process may be left on the machine.

The notebooks are stored executed, so GitHub shows their pictures and each rank's
output. The same run is compared with the stored outputs, what changes from run to run
set aside (numbers, host names, how rank lines group: ``_stored.py``), and a stale
notebook fails naming the cells that differ. Store them again with
``python -m tests.notebooks.store [NAME ...]``.

The notebooks run in a temporary directory so that files they write (hostfiles,
traces, checkpoints) do not land in the repository; the other notebooks are copied
beside them, as in notebooks/ (08 exports 03 as a batch job).

Notebook 08 runs twice: on the two-node Slurm test bed (ranks on node1 and node2, a
real sbatch job; the stored outputs are this run's), and with no Slurm in sight, as on
Binder (its kernel's PATH holds only this Python's bin/, so there is no sbatch).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
import pytest

from tests.notebooks._run import (
    CHECKED,
    NOTEBOOKS,
    SLURM_NOTEBOOK,
    code_cells,
    execute,
    output_text,
)
from tests.notebooks._stored import WIDGET_MIME, differences, for_storage, unexecuted

MAX_NOTEBOOK_BYTES = 250_000  # what a reader's browser loads to show one notebook


def test_the_teaching_notebooks_exist():
    names = [p.name[:3] for p in NOTEBOOKS]
    assert names[:1] == ["00_"], f"notebooks found: {[p.name for p in NOTEBOOKS]}"
    assert len(names) == len(set(names)), f"two notebooks share a number: {names}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_executed_and_self_contained(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = code_cells(nb)
    store = f"store it with: python -m tests.notebooks.store {path.stem}"
    assert not unexecuted(nb), f"{path.name}: code cells {unexecuted(nb)} never ran; {store}"
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), f"{path.name}: not one run, top to bottom"
    # no execution metadata, widget state, empty areas or \r: what the script writes
    assert for_storage(nb, shrink_images=False) == nb, f"{path.name}: not as stored; {store}"
    assert not any(WIDGET_MIME in o.get("data", {}) for c in code for o in c.outputs)
    size = path.stat().st_size
    assert size < MAX_NOTEBOOK_BYTES, f"{path.name} has {size} bytes: smaller pictures, please"
    sources = [c.source for c in code]
    assert any("%load_ext clusterkernel" in s for s in sources), path.name
    assert any("%mpi start" in s for s in sources), f"{path.name} must start its own ranks"
    assert sources[-1].strip() == "%mpi stop", f"{path.name} must end with a %mpi stop cell"
    checks = [s for s in sources if "assert " in s and CHECKED in s]
    assert checks, f"{path.name} needs a final cell that asserts key values and prints {CHECKED!r}"


def _execute_and_compare(path: Path, tmp_path: Path):
    """Run ``path`` (``_run.execute``), then compare the run with the stored outputs."""
    nb = execute(path, tmp_path)
    stale = differences(nbformat.read(path, as_version=4), nb)
    assert not stale, (
        f"{path.name}: the stored outputs are not what a fresh run gives (numbers, host "
        f"names and the grouping of rank lines aside; - stored, + this run):\n{stale}\n"
        f"If the change is meant, store it again: python -m tests.notebooks.store {path.stem}"
    )
    return nb


def _cell_output(nb, source: str) -> str:
    """The text output of the code cell whose source is ``source``."""
    cells = [c for c in code_cells(nb) if c.source.strip() == source]
    assert cells, f"no cell {source!r}"
    return "".join(output_text(o) for o in cells[0].outputs)


@pytest.mark.parametrize(
    "path", [p for p in NOTEBOOKS if p != SLURM_NOTEBOOK], ids=lambda p: p.stem
)
def test_notebook_executes_and_gives_the_stored_outputs(
    path: Path, no_shared_cluster, tmp_path: Path
):
    _execute_and_compare(path, tmp_path)


def test_notebook_08_without_slurm_runs_on_this_machine(no_shared_cluster, tmp_path: Path):
    # Binder's case: no sbatch on PATH. Slurm's commands sit in /usr/bin here, beside
    # everything else, so the kernel gets this Python's bin/ alone (mpiexec is there).
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    env.pop("SLURM_CONF", None)
    # not compared: the stored outputs are the Slurm run's (the next test)
    nb = execute(SLURM_NOTEBOOK, tmp_path, env)
    outputs = "".join(output_text(o) for c in code_cells(nb) for o in c.outputs)
    assert "No Slurm here (sbatch is not on PATH)" in outputs, outputs[:2000]
    assert "With Slurm you would run:" in outputs
    assert not list(tmp_path.glob("work/sgd_job-[0-9]*.out")), "a Slurm job ran without Slurm"


def test_notebook_08_runs_on_two_slurm_nodes(slurm_testbed, no_shared_cluster, tmp_path: Path):
    nb = _execute_and_compare(SLURM_NOTEBOOK, tmp_path)  # the kernel inherits SLURM_CONF
    status = _cell_output(nb, "%mpi status")
    assert "node1" in status and "node2" in status, status
    # the exported notebook 03 ran as a batch job: its output file is named by job id
    assert list(tmp_path.glob("work/sgd_job-[0-9]*.out")), sorted(os.listdir(tmp_path / "work"))
    deadline = time.monotonic() + 20
    while True:
        left = (
            slurm_testbed.jobs(),
            slurm_testbed.pids_on("node1"),
            slurm_testbed.pids_on("node2"),
        )
        if not any(left) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert not any(left), f"jobs / processes on node1 / node2 left behind: {left}"
