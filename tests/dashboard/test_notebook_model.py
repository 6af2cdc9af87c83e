"""The dashboard in a real Jupyter kernel (headless, nbclient): its data is the ranks' data.

Four ranks train with the Trainer under ``%%mpi --dashboard`` while the cell
blocks the kernel; afterwards the store must hold exactly the records each rank's
recorder holds, and the loss lines exactly each rank's logged steps and losses.
"""

from __future__ import annotations

import csv
import json

from nbclient import NotebookClient

from tests._procs import wait_no_cluster_processes
from tests.dashboard._cells import notebook, train_cell

CHECK = r"""
import json, struct
from pathlib import Path
def _records():
    from clusterkernel import metrics
    return metrics.recorder().records()
cluster = dash.cluster
report = {"updates_during_cell": updates_after - updates_before, "ranks": {}}
for rank, recs in zip(cluster.ranks, cluster.view().apply_sync(_records)):
    mine = dash.store.records(ranks=[rank])
    loss = [r for r in recs if r["kind"] == "scalar" and "loss" in r["values"]]
    line_x, line_y = dash._view.loss.line(rank)
    report["ranks"][rank] = {
        "store_equals_rank": mine == recs,
        "n_records": len(recs),
        "loss_steps": [r["step"] for r in loss],
        "line_x_is_steps": [float(v) for v in line_x] == [float(r["step"]) for r in loss],
        "line_y_is_loss": [float(v) for v in line_y] == [r["values"]["loss"] for r in loss],
        "all_reduce_rows": [row["count"] for row in dash.store.comm_table()
                            if row["rank"] == rank and row["op"] == "all_reduce"],
        "timeline": len([t for t in dash.store.timeline(1e9) if t[0] == rank]),
    }
report["dashboard_error"] = repr(dash.error)
report["header"] = dash._view.header.value
report["loss_title"] = dash._view.loss.plot.title
report["loss_xlim"] = dash._view.loss.plot.xlim
report["timeline_marks"] = sorted(dash._view.timeline._shown)
report["metric_options"] = list(dash._view.loss.choice.options)
report["status_html"] = dash._view.status.widget.value
paths = dash.export(EXPORT_DIR)
report["paths"] = {k: str(v) for k, v in paths.items()}
report["same_dashboard"] = cluster.dashboard() is dash
print("REPORT " + json.dumps(report))
"""


# paused: the record grows, nothing is redrawn; resumed: the new step is drawn
PAUSE_CHECK = """import json, time
paused = {"updates_while_paused": dash.updates - u0, "messages_while_paused": dash.store.messages - n0}
u1 = dash.updates
dash.resume()
time.sleep(1.5)
paused["updates_after_resume"] = dash.updates - u1
paused["last_step_drawn"] = int(dash._view.loss.line(0)[0][-1])
print("REPORT " + json.dumps(paused))
"""


def _report(cell) -> dict:
    for out in cell.outputs:
        if out.get("output_type") == "stream" and "REPORT " in out["text"]:
            return json.loads(out["text"].split("REPORT ", 1)[1])
    raise AssertionError(f"no report in {cell.outputs}")


def test_widgets_hold_exactly_what_every_rank_logged(no_shared_cluster, tmp_path):
    epochs = 2
    nb = notebook(
        "%load_ext clusterkernel",
        "%mpi start -n 4",
        "import clusterkernel\ndash = clusterkernel.Dashboard(rate=10)\ndash",
        # a set-up cell that communicates before the first --dashboard cell
        "%%mpi\nimport torch\nfrom clusterkernel import comm\ncomm.all_reduce(torch.ones(4))",
        "updates_before = dash.updates",
        train_cell(epochs),
        "updates_after = dash.updates",
        f"EXPORT_DIR = {str(tmp_path / 'export')!r}\n" + CHECK,
        "%mpi dashboard",
        "dash.pause()\nu0, n0 = dash.updates, dash.store.messages",
        "%%mpi\nimport time, clusterkernel\nclusterkernel.log(step=10_000, loss=0.5)\ntime.sleep(1.5)",
        PAUSE_CHECK,
        "%mpi stop",
    )
    NotebookClient(nb, timeout=180, kernel_name="python3").execute()
    report = _report(nb.cells[7])
    paused = _report(nb.cells[11])
    assert paused["updates_while_paused"] == 0 and paused["messages_while_paused"] > 0
    assert paused["updates_after_resume"] > 0 and paused["last_step_drawn"] == 10_000

    steps = list(range(1, epochs * 2048 // 64 + 1))
    assert sorted(report["ranks"]) == ["0", "1", "2", "3"]
    for rank, r in report["ranks"].items():
        assert r["store_equals_rank"], f"rank {rank}: store differs from the rank's recorder"
        assert r["loss_steps"] == steps  # every step of every rank
        assert r["line_x_is_steps"] and r["line_y_is_loss"], rank
        assert r["all_reduce_rows"] and r["all_reduce_rows"][0] >= len(steps)
        assert r["timeline"] > 0
    # the drawing thread redrew while the cell blocked the kernel's main thread
    assert report["updates_during_cell"] >= 2
    assert set(report["metric_options"]) >= {"loss", "samples_per_s", "comm_s", "accuracy"}
    for rank in range(4):
        assert f"<tr><td>{rank}</td>" in report["status_html"]
    assert report["same_dashboard"]
    assert report["dashboard_error"] == "None" and "error" not in report["header"]
    # the first cell that logs is run 1 (the set-up cell's all_reduce takes no number),
    # and its step axis ends at its last step
    assert report["header"].startswith("<div class='ck-head'>run 1 of 1; "), report["header"]
    assert report["loss_title"] == "loss per rank, run 1"
    assert report["loss_xlim"] == [1.0, float(steps[-1])]
    assert {"all_reduce", "compute"} & set(report["timeline_marks"])

    # the dashboard was shown three times: its own cell, the --dashboard cell, %mpi dashboard
    for i in (2, 5, 8):
        mimes = [o.get("data", {}) for o in nb.cells[i].outputs]
        assert any("application/vnd.jupyter.widget-view+json" in m for m in mimes), i

    # exports: CSV/JSON/trace/PNG with every logged step
    paths = report["paths"]
    with open(paths["scalars_csv"]) as f:
        rows = list(csv.DictReader(f))
    loss_rows = [r for r in rows if r["loss"]]
    assert len(loss_rows) == 4 * len(steps)
    assert {int(r["rank"]) for r in loss_rows} == {0, 1, 2, 3}
    with open(paths["json"]) as f:
        doc = json.load(f)
    assert sum(r["n_records"] for r in report["ranks"].values()) == len(doc["records"])
    with open(paths["chrome_trace"]) as f:
        trace = json.load(f)["traceEvents"]
    spans = [e for e in trace if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1, 2, 3}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    with open(paths["png"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(paths["comm_csv"]) as f:
        assert sum(1 for _ in f) - 1 == sum(1 for r in doc["records"] if r["kind"] == "comm")
    left = wait_no_cluster_processes(30)
    assert not left, f"left behind: {[p.cmdline() for p in left]}"
