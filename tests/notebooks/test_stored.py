"""The comparison of stored and fresh outputs (``_stored.py``) on small notebooks made
here: what differs from run to run passes, a stale output fails and is named."""

from __future__ import annotations

import base64
import copy
import io
import socket

import nbformat
from nbformat.v4 import (
    new_code_cell,
    new_notebook,
    new_output,
)
from PIL import Image

from tests.notebooks._stored import HOST_NAME, WIDGET_NOTE, differences, for_storage

STYLE = "<style>.ck-rank{}</style>"


def _area(label: str, *lines: str) -> dict:
    """A rank area as the notebook renderer draws it."""
    html = f"{STYLE}<div class='ck-rank'><b>[{label}]</b><pre>{chr(10).join(lines)}</pre></div>"
    return new_output(
        "display_data", data={"text/html": html, "text/plain": "\n".join([f"[{label}]", *lines])}
    )


def _png(points: int) -> str:
    """A matplotlib line plot, as the inline backend gives it (anti-aliased RGBA)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 2.5), dpi=80)
    fig.subplots().plot([(i * 37) % 11 for i in range(points)])
    out = io.BytesIO()
    FigureCanvasAgg(fig).print_png(out)
    return base64.b64encode(out.getvalue()).decode()


def _notebook(seconds: str, host: str, grouped: bool, loss: str = "0.41") -> nbformat.NotebookNode:
    if grouped:  # both ranks printed the same timing, so the renderer shared the line
        areas = [_area("ranks 0-1", f"step took {seconds} ms")]
    else:
        areas = [_area(f"rank {r}", f"step took {seconds}{r} ms") for r in (0, 1)]
    cells = [
        new_code_cell(
            "%mpi start -n 2",
            execution_count=1,
            outputs=[
                new_output("stream", name="stdout", text=f"Started 2 MPI ranks in {seconds} s.\n")
            ],
        ),
        new_code_cell(
            "%%mpi\ntrain()",
            execution_count=2,
            outputs=[
                new_output("display_data", data={"text/plain": ""}),  # an empty shared area
                *areas,
                _area("rank 1", f"loss {loss}"),
            ],
        ),
        new_code_cell(
            "%mpi status",
            execution_count=3,
            outputs=[new_output("stream", name="stdout", text=f"0  {host}  {seconds}1  idle\n")],
        ),
        new_code_cell(
            "plot()",
            execution_count=4,
            outputs=[
                new_output(
                    "display_data",
                    data={"image/png": _png(int(seconds)), "text/plain": "<Figure size 480x280>"},
                )
            ],
        ),
    ]
    nb = new_notebook(cells=cells)
    nb.metadata = {
        "kernelspec": {"name": "python3"},
        "language_info": {"name": "python", "version": "3.11.7"},
    }
    return nb


def test_numbers_hosts_and_the_grouping_of_rank_lines_are_set_aside():
    # stored on another machine; the fresh run names this one
    stored = for_storage(_notebook("12", "storing-box", grouped=False), host="storing-box")
    fresh = _notebook("3457", socket.gethostname(), grouped=True)
    assert differences(stored, fresh) == ""
    status = stored.cells[2].outputs[0].text
    assert HOST_NAME in status and "storing-box" not in status


def test_a_stale_output_fails_naming_its_cell():
    stored = for_storage(_notebook("12", "vm", grouped=False), host="vm")
    fresh = _notebook("12", "vm", grouped=False)
    fresh.cells[1].outputs[-1] = _area("rank 1", "loss 0.41 (diverged)")
    fresh.cells[3].outputs = []
    diff = differences(stored, fresh)
    assert "code cell 2 (%%mpi | train())" in diff
    assert "-rank output: loss #" in diff and "+rank output: loss # (diverged)" in diff
    assert "code cell 4 (plot())" in diff and "-display_data [image/png+text/plain]" in diff
    assert "code cell 1" not in diff and "code cell 3" not in diff


def test_unexecuted_stored_notebook_says_so():
    stored = _notebook("12", "vm", grouped=False)
    for cell in stored.cells:
        cell.outputs, cell.execution_count = [], None
    assert "stored without outputs" in differences(stored, _notebook("12", "vm", grouped=False))


def test_storage_drops_run_noise_and_keeps_what_a_reader_sees():
    nb = _notebook("300", "vm", grouped=False)
    nb.cells[0].metadata["execution"] = {"iopub.status.busy": "2026-01-01T00:00:00Z"}
    nb.cells[0].outputs = [
        new_output("stream", name="stdout", text="Starting... 1 s\rStarting... 2 s\r"),
        new_output("stream", name="stdout", text="Started 2 MPI ranks.\n"),
    ]
    widget = {"application/vnd.jupyter.widget-view+json": {"model_id": "abc", "version_major": 2}}
    nb.cells[1].outputs.insert(
        0, new_output("display_data", data={**widget, "text/plain": "VBox()"})
    )
    stored = for_storage(nb, host="vm")
    assert stored.metadata == {
        "kernelspec": {"name": "python3"},
        "language_info": {"name": "python"},
    }
    assert "execution" not in stored.cells[0].metadata
    assert [o.text for o in stored.cells[0].outputs] == ["Started 2 MPI ranks.\n"]
    outs = stored.cells[1].outputs
    assert outs[0].data == {"text/plain": WIDGET_NOTE}
    assert all(o.data.get("text/plain") for o in outs), "empty rank areas are dropped"
    old_png = nb.cells[3].outputs[0].data["image/png"]
    new_png = stored.cells[3].outputs[0].data["image/png"]
    assert len(new_png) < len(old_png)
    assert Image.open(io.BytesIO(base64.b64decode(new_png))).mode == "P"
    again = for_storage(copy.deepcopy(stored), host="vm")
    assert again == stored  # storing twice changes nothing
