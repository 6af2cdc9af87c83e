"""The magics in a real Jupyter kernel: rank-ordered live areas, interrupt, kernel death.

Each test starts its own cluster inside the kernel, so the shared one is stopped
first (one cluster at a time).
"""

from __future__ import annotations

import os
import signal
import time

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests._kernels import kernel, wait_for_files
from tests._procs import cluster_processes, wait_no_cluster_processes


def _notebook(*cells: str):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    return nb


def _text(output) -> str:
    if output.get("output_type") == "stream":
        return output["text"]
    if output.get("output_type") == "error":
        return "\n".join(output["traceback"])
    return output.get("data", {}).get("text/plain", "")


def test_notebook_rank_areas_errors_stop_run_all_and_shutdown_cleans_up(no_shared_cluster):
    nb = _notebook(
        "%load_ext clusterkernel",
        "%mpi start -n 4",
        # rank 3 prints first, rank 0 last: areas must still be in rank order
        "%%mpi\nimport time\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.Get_rank()\n"
        "time.sleep(0.3 * (3 - r))\nprint(f'hello {r}')",
        # rich output lands in its rank's area: a figure from rank 0, HTML from rank 1
        "%%mpi\nfrom IPython.display import HTML, display\nimport matplotlib.pyplot as plt\n"
        "if r == 0:\n    plt.plot([1, 2, 3]); plt.show()\n"
        "elif r == 1:\n    display(HTML('<b>bold from one</b>'))",
        "%%mpi\nif r == 1:\n    raise ValueError('rank one fails')",
        "print('never runs')",
    )
    client = NotebookClient(nb, timeout=120, kernel_name="python3")
    with pytest.raises(CellExecutionError) as info:
        client.execute()
    assert "ValueError" in str(info.value) and "[rank 1] error" in str(info.value)
    areas = [_text(o) for o in nb.cells[2].outputs if o["output_type"] == "display_data"]
    assert areas[0] == ""  # the area for lines all ranks share: none here
    areas = areas[1:]
    assert [a.splitlines()[0] for a in areas] == [f"[rank {r}]" for r in range(4)]
    for r, area in enumerate(areas):
        assert f"hello {r}" in area
    html = nb.cells[2].outputs[1]["data"]["text/html"]
    assert "[rank 0]" in html and "hello 0" in html
    rich = {
        o["data"]["text/plain"].splitlines()[0]: o["data"]["text/html"]
        for o in nb.cells[3].outputs
        if o["output_type"] == "display_data" and o["data"]["text/plain"]
    }
    assert '<img src="data:image/png;base64,' in rich["[rank 0]"]
    assert "<b>bold from one</b>" in rich["[rank 1]"]
    assert "<img" not in rich["[rank 1]"]
    assert set(rich) == {"[rank 0]", "[rank 1]"}  # quiet ranks show nothing
    assert nb.cells[5].outputs == []  # "Run all" stopped at the failing cell
    # NotebookClient.execute shuts the kernel down cleanly at the end
    left = wait_no_cluster_processes(30)
    assert not left, f"left behind after kernel shutdown: {[p.cmdline() for p in left]}"


def _run(kc, code: str, timeout: float = 120) -> str:
    chunks: list[str] = []

    def hook(msg):
        content = msg["content"]
        if msg["msg_type"] == "stream":
            chunks.append(content["text"])
        elif msg["msg_type"] in ("display_data", "update_display_data", "execute_result"):
            chunks.append(content["data"].get("text/plain", ""))
        elif msg["msg_type"] == "error":
            chunks.append("\n".join(content["traceback"]))

    kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return "\n".join(chunks)


def test_interrupt_frees_ranks_and_killed_kernel_leaves_nothing(no_shared_cluster, tmp_path):
    with kernel() as (km, kc):
        _run(kc, "%load_ext clusterkernel")
        assert "Started 4 MPI ranks" in _run(kc, "%mpi start -n 4")
        before = len(cluster_processes())
        assert before >= 9  # controller, prterun, 4 engines, 4 nannies, guard
        # ranks 0 and 1 sleep (SIGINT stops them); 2 and 3 wait forever in a Barrier;
        # each says it got there with a file
        cell = (
            "%%mpi\nimport pathlib, time\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.Get_rank()\n"
            f"pathlib.Path({str(tmp_path)!r}, str(r)).touch()\n"
            "if r < 2:\n    time.sleep(600)\n"
            "else:\n    MPI.COMM_WORLD.Barrier()"
        )
        msg_id = kc.execute(cell)
        wait_for_files([tmp_path / str(r) for r in range(4)])
        km.interrupt_kernel()
        out = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            msg = kc.get_iopub_msg(timeout=90)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        report = "\n".join(out)
        assert "interrupted" in report
        assert "[ranks 2-3]" in report and "did not respond to SIGINT" in report
        assert "MPI.COMM_WORLD.Barrier()" in report  # the stuck line, from the stack
        assert "[ranks 0-1]" in report
        # the cluster works again for the very next cell
        again = _run(kc, "%%mpi\nprint('ok again')")
        assert "[ranks 0-3]\nok again" in again  # once, in the shared area
        # stopping prints one line, not ipyparallel's engine logs and exit codes
        assert _run(kc, "%mpi stop").strip() == "Stopped all MPI ranks."
        assert "Started 2 MPI ranks" in _run(kc, "%mpi start -n 2")
        # kill the kernel outright: the guard must stop the cluster within 20 s
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        km.provisioner.process.wait()
    left = wait_no_cluster_processes(20)
    assert not left, f"left behind 20 s after SIGKILL: {[p.cmdline() for p in left]}"
