"""The MPI kernel under nbclient: cells run on the ranks, %%local runs in the kernel.

Two ranks (the kernelspec of the ``mpi_kernel`` fixture). Per-rank output is what
``%%mpi`` shows; the ranks start with the first cell and are gone once the kernel
shuts down (only the processes this test started are looked at).
"""

from __future__ import annotations

import re

import nbformat
from nbclient import NotebookClient

from tests._procs import cluster_processes, wait_gone


def _text(cell) -> str:
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(out.data.get("text/plain", ""))
    return "\n".join(parts)


def _rank_blocks(text: str) -> dict[str, str]:
    """``[rank R]`` / ``[ranks A-B]`` headings and what follows each, as %%mpi shows them."""
    blocks = {}
    for m in re.finditer(r"\[ranks? ([\d,-]+)\]\s*\n(.*?)(?=\n\[rank|\Z)", text, re.S):
        blocks[m.group(1)] = m.group(2).strip()
    return blocks


def test_cells_run_on_the_ranks_local_cells_here_and_ranks_stop_with_the_kernel(mpi_kernel):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("from clusterkernel import comm\nprint(comm.rank())"),
        nbformat.v4.new_code_cell("%%local\nimport os\nprint('local', os.getpid())\n6 * 7"),
        nbformat.v4.new_code_cell("%mpi status"),
        nbformat.v4.new_code_cell("print(comm.size(), 'ranks;', 'os' in dir())"),
        nbformat.v4.new_code_cell("%%mpi\nprint(comm.size(), 'ranks;', 'os' in dir())"),
    ]
    client = NotebookClient(nb, timeout=240, kernel_name=mpi_kernel)
    with client.setup_kernel():
        kernel_pid = client.km.provisioner.pid
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        running = cluster_processes()

    first = _text(nb.cells[0])
    assert "Starting 2 MPI ranks..." in first and "Started 2 MPI ranks" in first, first
    assert _rank_blocks(first) == {"0": "0", "1": "1"}, first

    local = nb.cells[1]
    assert _text(local).splitlines()[0] == f"local {kernel_pid}"  # the kernel's own process
    assert local.outputs[-1].output_type == "execute_result"
    assert local.outputs[-1].data["text/plain"] == "42"

    rows = [line.split() for line in _text(nb.cells[2]).splitlines()[1:] if line.strip()]
    assert [int(r[0]) for r in rows] == [0, 1], rows
    rank_pids = {int(r[2]) for r in rows}
    assert rank_pids <= {p.pid for p in running}, "the ranks are not this kernel's"

    # the ranks keep their state between cells (the local cell's import is not
    # theirs), and a cell shows exactly what the same cell under %%mpi shows
    plain, explicit = _text(nb.cells[3]), _text(nb.cells[4])
    assert _rank_blocks(plain) == {"0-1": "2 ranks; False"}, plain
    assert plain == explicit
    assert "Starting" not in _text(nb.cells[3])  # started once

    assert kernel_pid in {p.pid for p in running}
    left = wait_gone(running, 30)
    assert not left, f"still running after the kernel shut down: {[p.cmdline() for p in left]}"
