"""Runs: each execution of a cell that records is a run of its own in the dashboard.

The ranks' side is real (``Recorder`` marks cells as the engine's ``pre_run_cell``
hook does, and the stream's ``Publisher`` packs the messages, signed and decoded as
on the wire); the notebook's side is the store and the panels, asserted on the
values the widgets hold. No MPI here: the cluster path is in ``test_notebook_model``.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from clusterkernel.client.dashboard import MetricsStore, chrome_trace, summary
from clusterkernel.client.dashboard._views import FAINT, DashboardView, rank_color
from clusterkernel.metrics import Recorder
from clusterkernel.metrics._stream import Publisher
from clusterkernel.protocol import _wire

KEY = b"k" * 32


def _send(pub: Publisher, store: MetricsStore) -> None:
    """One message from ``pub`` into ``store``, as the stream thread and receiver do."""
    msg, upto = pub._message()
    msg["seq"], msg["pc"], msg["wall"] = pub.seq + 1, time.perf_counter(), time.time()
    store.ingest(_wire.decode(KEY, _wire.encode(KEY, msg), columns=True))
    pub.seq += 1
    pub.cells_sent = upto.pop("cells")
    pub.sent = upto


def _train(rec: Recorder, cell: str, steps: int, loss0: float) -> None:
    rec.mark_cell(cell)
    for step in range(steps):
        rec.log(step=step, loss=loss0 / (step + 1), samples=32)
        rec.timing("all_reduce", 4096, time.perf_counter(), 1e-4, 1e-4, "mpi", 2)


def test_a_cell_run_twice_is_two_runs_never_joined_and_the_newest_is_drawn():
    store, ranks = MetricsStore(), (0, 1)
    recs = [Recorder(rank=r) for r in ranks]
    pubs = [Publisher("tcp://127.0.0.1:9", KEY, rec) for rec in recs]
    view = DashboardView(max_points=1000)
    for rec in recs:
        _train(rec, "ck-cell aaa", 200, 2.0)
    for pub in pubs:
        _send(pub, store)
    view.loss.update(store)
    assert view.loss.run == 0 and view.loss.faint_lines() == 0
    # the same cell again; rank 1's two cells reach the notebook in one message
    for rec in recs:
        _train(rec, "ck-cell bbb", 50, 1.0)
    _train(recs[1], "cell 7", 0, 1.0)  # a cell that records nothing is no run
    for pub in pubs:
        _send(pub, store)

    runs = store.runs()
    assert [(r["label"], r["ranks"], r["comm"]) for r in runs] == [
        ("run 1", [0, 1], 400),
        ("run 2", [0, 1], 100),
    ]
    assert runs[0]["end"] <= runs[1]["start"]
    assert store.current_run("loss") == 1
    for rank in ranks:
        steps, loss = store.series("loss")[rank]  # the newest run
        assert steps.tolist() == list(range(50)) and loss[0] == 1.0
        assert store.series("loss", run=0)[rank][0].tolist() == list(range(200))

    assert view.loss.update(store) > 0
    drawn = view.loss.plot.drawn()
    for rank in ranks:  # the current run in full colour, its own line: step 0 to 49
        assert view.loss.line(rank)[0].tolist() == list(range(50))
    faint = [m for m in view.loss.plot.series if not m["label"]]
    assert sorted(m["color"] for m in faint) == sorted(rank_color(r) + FAINT for r in ranks)
    for key, (x, _) in drawn.items():  # no line goes back from step 199 to step 0
        assert np.all(np.diff(x) > 0), key
    assert view.loss.plot.xlim[0] == 0.0 and view.loss.plot.xlim[1] < 199  # this run's steps
    assert view.loss.plot.title.endswith("run 2")
    # throughput of run 2 counts from run 2's own start, not from the end of run 1
    assert all(len(x) == 49 for x, _ in store.series("samples_per_s").values())
    # the comm table: run 2's calls only
    assert {(r["rank"], r["count"]) for r in store.comm_table()} == {(0, 50), (1, 50)}
    view.comm.update(store)
    assert "run 2" in view.comm.widget.value
    assert view.loss.update(store) == 0  # nothing new: nothing sent

    store.clear()
    assert store.runs() == [] and store.series("loss") == {}
    view.loss.update(store)
    assert view.loss.plot.drawn() == {}
    view.comm.update(store)
    assert "no communication yet" in view.comm.widget.value
    for rec in recs:  # recorded after the clear: drawn, as a run of its own
        rec.mark_cell("ck-cell ccc")
        rec.log(step=0, loss=0.5)
    for pub in pubs:
        _send(pub, store)
    assert [r["label"] for r in store.runs()] == ["run 1"]  # a fresh picture, numbered anew
    assert store.status()[0]["gaps"] == 0  # the stream's state survived the clear
    view.loss.update(store)
    assert view.loss.line(0)[1].tolist() == [0.5]


def test_records_before_any_cell_join_the_newest_run():
    # a job under plain mpiexec marks no cells: all of it is one run
    store, rec = MetricsStore(), Recorder(rank=0)
    pub = Publisher("tcp://127.0.0.1:9", KEY, rec)
    for step in range(3):
        rec.log(step=step, loss=1.0)
        _send(pub, store)
    assert [r["label"] for r in store.runs()] == ["run 1"]
    assert store.series("loss")[0][0].tolist() == [0, 1, 2]


def test_an_unmeasured_blocked_time_is_blank_not_zero():
    store, rec = MetricsStore(), Recorder(rank=0)
    pub = Publisher("tcp://127.0.0.1:9", KEY, rec)
    rec.mark_cell("ck-cell x")
    t = time.perf_counter()
    for i in range(3):  # torch DDP buckets: in flight 2 ms, time blocked not known
        rec.timing("torch all_reduce", 4040, t + i * 0.01, 0.002, float("nan"), "gloo", 2)
    rec.timing("all_reduce", 64, t + 0.05, 0.004, 0.001, "mpi", 2)  # async, waited 1 ms
    _send(pub, store)
    rows = {r["op"]: r for r in store.comm_table()}
    assert rows["torch all_reduce"]["wait_s"] is None
    assert rows["torch all_reduce"]["seconds"] == pytest.approx(0.006)
    assert rows["all_reduce"]["wait_s"] == pytest.approx(0.001)
    view = DashboardView()
    view.comm.update(store)
    table = view.comm.widget.value
    assert "<th>blocked s</th>" in table and "<td>0.0010</td>" in table
    torch_row = table.split("torch all_reduce", 1)[1].split("</tr>", 1)[0]
    assert "<td></td>" in torch_row and "0.0000" not in torch_row
    assert "0.0000" not in summary(store)
    json.dumps(chrome_trace(store), allow_nan=False)  # valid JSON: null, not NaN


def test_every_call_shows_in_the_timeline_at_hundreds_of_calls():
    store, rec = MetricsStore(), Recorder(rank=0)
    pub = Publisher("tcp://127.0.0.1:9", KEY, rec)
    rec.mark_cell("ck-cell old")
    t0 = time.perf_counter()
    rec.timing("broadcast", 64, t0 - 7.0, 0.5, 0.5)  # an earlier run's call
    rec.mark_cell("ck-cell new")
    # 0.5 ms every 8 ms, ended 3.5 s ago: the ranks are quiet, the picture stays
    calls = [(t0 - 5.5 + i * 0.008, 0.0005) for i in range(250)]
    for start, dur in calls:
        rec.timing("torch all_reduce", 4040, start, dur, float("nan"), "gloo", 2)
    _send(pub, store)
    view = DashboardView(window=10.0)
    view.timeline.update(store, [0])
    bars = view.timeline.bars("torch all_reduce")
    offset = store.wall_offset(0)
    now = store.latest() + 1.0  # quiet: the window ends a second after the last call
    mids = np.array([start + dur / 2 + offset - now for start, dur in calls])
    covered = ((mids[:, None] >= bars[:, 0]) & (mids[:, None] <= bars[:, 1])).any(axis=1)
    assert covered.all(), f"{(~covered).sum()} of 250 calls not drawn"
    assert "broadcast" not in view.timeline._shown  # the earlier run stays out


def test_the_first_training_cell_is_run_1_and_its_axes_end_at_its_last_step():
    # a set-up cell that only communicates, then the first cell that logs: 300 steps,
    # sent while they are logged, the panels redrawn after every message as live
    store, ranks = MetricsStore(), (0, 1)
    recs = [Recorder(rank=r) for r in ranks]
    pubs = [Publisher("tcp://127.0.0.1:9", KEY, rec) for rec in recs]
    view = DashboardView(max_points=1000)
    for rec in recs:
        rec.mark_cell("ck-cell setup")
        rec.timing("all_reduce", 16, time.perf_counter(), 1e-4, 1e-4, "mpi", 2)
        rec.mark_cell("ck-cell train")
    for first in range(0, 300, 30):
        for rec in recs:
            for step in range(first, first + 30):
                rec.log(step=step, loss=2.0 / (step + 1), samples=32)
                rec.timing("all_reduce", 4096, time.perf_counter(), 1e-4, 1e-4, "mpi", 2)
        for pub in pubs:
            _send(pub, store)
        view.loss.update(store)
        view.throughput.update(store)
        # live too, the step axis ends where the lines end
        assert view.loss.plot.xlim == [0.0, first + 29.0]
        assert view.throughput.plot.xlim[1] == first + 29.0

    runs = store.runs()
    assert [(r["label"], r["number"], r["comm"]) for r in runs] == [
        ("", None, 2),
        ("run 1", 1, 600),
    ]
    assert store.heading() == "run 1 of 1"
    assert view.loss.plot.title == "loss per rank, run 1"
    assert view.throughput.plot.title.endswith(", run 1")
    assert view.loss.plot.xlim == [0.0, 299.0]
    assert view.throughput.plot.xlim == [1.0, 299.0]  # step 0 has no rate: nothing before it
    view.comm.update(store)
    assert "time per communication op, run 1" in view.comm.widget.value
    assert {(r["rank"], r["count"]) for r in store.comm_table()} == {(0, 300), (1, 300)}
    # the same cell again: run 2 of 2, and the set-up cell's calls still took no number
    for rec in recs:
        _train(rec, "ck-cell train again", 40, 1.0)
    for pub in pubs:
        _send(pub, store)
    view.loss.update(store)
    assert store.heading() == "run 2 of 2" and view.loss.plot.title.endswith("run 2")
    assert view.loss.plot.xlim == [0.0, 39.0]
