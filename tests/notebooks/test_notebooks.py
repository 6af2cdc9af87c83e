"""Every teaching notebook runs top to bottom in a fresh kernel against real MPI ranks.

Each notebook starts its own cluster (so the shared one is stopped first), computes
something, checks it in a final assert cell (printing ``all checks passed``) and stops
its ranks with ``%mpi stop``. A failing assert or any unexpected error fails the test
with the cell's traceback; afterwards no cluster process may be left on the machine.

The notebooks run in a temporary directory so that files they write (hostfiles,
traces, checkpoints) do not land in the repository.
"""

from __future__ import annotations

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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path: Path, no_shared_cluster, tmp_path: Path):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    started = time.monotonic()
    client.execute()  # raises CellExecutionError, with the traceback, on any failure
    print(f"{path.name}: {time.monotonic() - started:.1f} s")
    outputs = "".join(_text(o) for c in _code_cells(nb) for o in c.outputs)
    assert CHECKED in outputs, f"{path.name} ran but its check cell printed nothing"
    left = wait_no_cluster_processes(30)
    assert not left, f"{path.name} left processes behind: {[p.cmdline() for p in left]}"
