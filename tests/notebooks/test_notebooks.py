"""Every teaching notebook runs top to bottom in a fresh kernel against real MPI ranks.

Each notebook starts its own cluster (so the shared one is stopped first), computes
something, checks it in a final assert cell (printing ``all checks passed``) and stops
its ranks with ``%mpi stop``. A failing assert or any unexpected error fails the test
with the cell's traceback; afterwards no cluster process may be left on the machine.

The notebooks run in a temporary directory so that files they write (hostfiles,
traces, checkpoints) do not land in the repository; the other notebooks are copied
beside them, as in notebooks/ (08 exports 03 as a batch job).

Notebook 08 runs twice: on the two-node Slurm test bed (ranks on node1 and node2, a
real sbatch job), and with no Slurm in sight, as on Binder (its kernel's PATH holds
only this Python's bin/, so there is no sbatch).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests._procs import wait_no_cluster_processes

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT = 240  # seconds; a hang guard only: the notebooks take seconds per cell
CHECKED = "all checks passed"
SLURM_NOTEBOOK = NOTEBOOK_DIR / "08_beyond_one_machine.ipynb"


def _code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def _text(output) -> str:
    if output.get("output_type") == "stream":
        return output["text"]
    return output.get("data", {}).get("text/plain", "")


def test_the_teaching_notebooks_exist():
    names = [p.name[:3] for p in NOTEBOOKS]
    assert names[:1] == ["00_"], f"notebooks found: {[p.name for p in NOTEBOOKS]}"
    assert len(names) == len(set(names)), f"two notebooks share a number: {names}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_clean_and_self_contained(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = _code_cells(nb)
    dirty = [i for i, c in enumerate(code) if c.outputs or c.execution_count is not None]
    assert not dirty, f"{path.name}: strip the outputs of code cells {dirty} before committing"
    sources = [c.source for c in code]
    assert any("%load_ext clusterkernel" in s for s in sources), path.name
    assert any("%mpi start" in s for s in sources), f"{path.name} must start its own ranks"
    assert sources[-1].strip() == "%mpi stop", f"{path.name} must end with a %mpi stop cell"
    checks = [s for s in sources if "assert " in s and CHECKED in s]
    assert checks, f"{path.name} needs a final cell that asserts key values and prints {CHECKED!r}"


def _execute(path: Path, tmp_path: Path, env: dict[str, str] | None = None):
    """Run ``path`` top to bottom in a fresh kernel in ``tmp_path``; return the notebook."""
    for sibling in NOTEBOOKS:
        shutil.copy(sibling, tmp_path)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    started = time.monotonic()
    # raises CellExecutionError, with the traceback, on any failure; env=None: the
    # kernel inherits os.environ
    client.execute(**({"env": env} if env is not None else {}))
    print(f"{path.name}: {time.monotonic() - started:.1f} s")
    outputs = "".join(_text(o) for c in _code_cells(nb) for o in c.outputs)
    assert CHECKED in outputs, f"{path.name} ran but its check cell printed nothing"
    left = wait_no_cluster_processes(30)
    assert not left, f"{path.name} left processes behind: {[p.cmdline() for p in left]}"
    return nb


def _cell_output(nb, source: str) -> str:
    """The text output of the code cell whose source is ``source``."""
    cells = [c for c in _code_cells(nb) if c.source.strip() == source]
    assert cells, f"no cell {source!r}"
    return "".join(_text(o) for o in cells[0].outputs)


@pytest.mark.parametrize(
    "path", [p for p in NOTEBOOKS if p != SLURM_NOTEBOOK], ids=lambda p: p.stem
)
def test_notebook_executes(path: Path, no_shared_cluster, tmp_path: Path):
    _execute(path, tmp_path)


def test_notebook_08_without_slurm_runs_on_this_machine(no_shared_cluster, tmp_path: Path):
    # Binder's case: no sbatch on PATH. Slurm's commands sit in /usr/bin here, beside
    # everything else, so the kernel gets this Python's bin/ alone (mpiexec is there).
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    env.pop("SLURM_CONF", None)
    nb = _execute(SLURM_NOTEBOOK, tmp_path, env)
    outputs = "".join(_text(o) for c in _code_cells(nb) for o in c.outputs)
    assert "No Slurm here (sbatch is not on PATH)" in outputs, outputs[:2000]
    assert "With Slurm you would run:" in outputs
    assert not list(tmp_path.glob("work/sgd_job-[0-9]*.out")), "a Slurm job ran without Slurm"


def test_notebook_08_runs_on_two_slurm_nodes(slurm_testbed, no_shared_cluster, tmp_path: Path):
    nb = _execute(SLURM_NOTEBOOK, tmp_path)  # its kernel inherits the test bed's SLURM_CONF
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
