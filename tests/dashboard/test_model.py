"""The dashboard's model, thinning, exports and panels on hand-made messages (no MPI)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from clusterkernel import Dashboard, metrics
from clusterkernel.client.dashboard import MetricsStore, chrome_trace, summary, thin, to_csv
from clusterkernel.client.dashboard._views import _CSS, DashboardView, _occupancy, _runs
from clusterkernel.client.errors import ClusterError
from clusterkernel.protocol import _wire


def _msg(rank, seq, scalars=(), comm=(), spans=(), pc=100.0, wall=1000.0, lost=None):
    return {
        "v": _wire.VERSION,
        "rank": rank,
        "seq": seq,
        "pc": pc,
        "wall": wall,
        "scalar": [list(s) for s in scalars],
        "comm": [list(c) for c in comm],
        "span": [list(s) for s in spans],
        "lost": lost or {},
        "proc": {"host": "h", "pid": 10 + rank, "cpu": 50.0, "rss_mib": 100.0},
    }


def test_thin_keeps_extremes_order_and_ignores_nan():
    x = np.arange(10_000, dtype=float)
    y = np.sin(x / 300)
    y[5_000] = 50.0  # a spike must survive
    y[7_000] = np.nan
    tx, ty = thin(x, y, 500)
    assert len(tx) <= 502 and np.all(np.diff(tx) > 0)
    assert 50.0 in ty and tx[0] == 0
    assert np.nanmin(ty) == pytest.approx(np.nanmin(y))
    short = np.arange(10.0)
    assert thin(short, short, 500)[0] is short  # nothing to thin
    with pytest.raises(ValueError, match="at least 4"):
        thin(x, y, 2)


def test_store_series_comm_totals_gaps_and_records():
    s = MetricsStore()
    s.ingest(_msg(1, 1, scalars=[(0, 100.0, {"loss": 2.0})]))
    s.ingest(_msg(0, 1, scalars=[(0, 100.0, {"loss": 1.0, "samples_per_s": 9.0})]))
    comm = [("all_reduce", 400, "mpi", 2, 100.5, 0.1, 0.05)] * 3
    s.ingest(_msg(0, 3, scalars=[(1, 101.0, {"loss": 0.5})], comm=comm))  # seq 2 missing
    assert s.ranks() == [0, 1]
    steps, loss = s.series("loss")[0]
    assert steps.tolist() == [0, 1] and loss.tolist() == [1.0, 0.5]
    assert s.last("loss") == {0: (1.0, 0.5), 1: (0.0, 2.0)}
    assert s.scalar_names() == ["loss", "samples_per_s"]
    (row,) = s.comm_table()
    assert row == {
        "rank": 0,
        "op": "all_reduce",
        "algorithms": ["mpi"],
        "count": 3,
        "nbytes": 1200,
        "seconds": pytest.approx(0.3),
        "wait_s": pytest.approx(0.15),
    }
    st = s.status()
    assert st[0]["gaps"] == 1 and st[1]["gaps"] == 0 and st[0]["pid"] == 10
    recs = s.records(ranks=[0])
    assert [r["kind"] for r in recs] == ["comm"] * 3 + ["scalar"] * 2
    assert recs[0]["op"] == "all_reduce" and recs[0]["rank"] == 0
    assert s.wait_for({0: 3, 1: 1}, timeout=0.1)
    assert not s.wait_for({0: 4}, timeout=0.1)
    with pytest.raises(ValueError, match="bad rank"):
        s.ingest(_msg(-1, 1))
    with pytest.raises(ValueError, match="unknown record kind"):
        s.records("nope")


def test_timeline_is_wall_clock_aligned_across_ranks():
    s = MetricsStore()
    now = time.time()
    # rank 0's perf_counter is 100 at wall `now`; rank 1's is 5000 at the same moment
    s.ingest(_msg(0, 1, comm=[("send", 8, "mpi", 2, 99.0, 0.5, 0.1)], pc=100.0, wall=now))
    s.ingest(_msg(1, 1, spans=[("forward", 4999.0, 0.25)], pc=5000.0, wall=now))
    got = sorted(s.timeline(window=10, now=now))
    assert got == [
        (0, "blocked", "", pytest.approx(-0.6), pytest.approx(-0.5)),  # the last 0.1 s waited
        (0, "comm", "send", pytest.approx(-1.0), pytest.approx(-0.5)),
        (1, "span", "forward", pytest.approx(-1.0), pytest.approx(-0.75)),
    ]
    assert s.timeline(window=0.2, now=now) == []
    # back-to-back calls become one interval to draw; the records stay apart
    calls = [("send", 8, "mpi", 2, 100.0 + 0.002 * i, 0.002, 0.001) for i in range(100)]
    s.ingest(_msg(2, 1, comm=calls, pc=100.2, wall=now))
    drawn = [t for t in s.timeline(window=10, now=now) if t[:2] == (2, "comm")]
    assert drawn == [(2, "comm", "send", pytest.approx(-0.2, abs=1e-6), pytest.approx(0, abs=1e-6))]
    assert len(s.records("comm", ranks=[2])) == 100
    occ = _occupancy(np.array([0.1, 0.5, 3.9]), np.array([0.15, 2.25, 5.0]), 0.0, 1.0, 4)
    assert occ.tolist() == pytest.approx([0.55, 1.0, 0.25, 0.1])
    assert _runs(occ >= 0.5) == [(0, 2)]


def test_exports_round_trip(tmp_path):
    s = MetricsStore()
    s.ingest(_msg(0, 1, scalars=[(0, 100.0, {"loss": 1.0})], pc=100.0, wall=1000.0))
    s.ingest(
        _msg(
            1,
            1,
            scalars=[(0, 50.0, {"loss": 3.0, "acc": 0.5})],
            comm=[("broadcast", 16, "mpi", 2, 50.0, 0.002, 0.0)],
            spans=[("backward", 49.0, 0.5)],
            pc=50.0,
            wall=1000.0,
        )
    )
    path = to_csv(s, tmp_path / "s.csv")
    lines = path.read_text().splitlines()
    assert lines[0] == "rank,step,time,acc,loss"
    assert lines[1:] == ["0,0,100.0,,1.0", "1,0,50.0,0.5,3.0"]
    trace = chrome_trace(s)
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {(e["pid"], e["tid"], e["name"]) for e in xs} == {
        (1, 1, "broadcast"),
        (1, 0, "backward"),
    }
    back = next(e for e in xs if e["name"] == "backward")
    assert back["ts"] == 0 and back["dur"] == pytest.approx(5e5)
    json.dumps(trace)  # serialisable as is
    text = summary(s)
    assert "broadcast" in text and text.splitlines()[1].split()[:2] == ["0", "1"]


def test_panels_draw_what_the_store_holds():
    s = MetricsStore()
    now = time.time()
    for rank in range(3):
        scal = [
            (i, 100.0 + i, {"loss": rank + 1 / (i + 1), "samples_per_s": 10.0}) for i in range(50)
        ]
        # 4 ms in all_reduce, then 46 ms of compute, for the last 2 s
        comm = [("all_reduce", 64, "mpi", 3, 98.3 + i * 0.05, 0.004, 0.004) for i in range(40)]
        s.ingest(_msg(rank, 1, scalars=scal, comm=comm, pc=100.3, wall=now))
    view = DashboardView(window=10.0, max_points=1000)
    view.loss.update(s)
    view.throughput.update(s)
    view.comm.update(s)
    view.timeline.update(s, s.ranks())
    view.status.update(s, {r: {"state": "busy"} for r in range(3)})
    for rank in range(3):
        x, y = view.loss.line(rank)
        assert x.tolist() == list(range(50))
        assert y[0] == pytest.approx(rank + 1.0)
    assert [m["label"] for m in view.loss.plot.series] == ["rank 0", "rank 1", "rank 2"]
    s.ingest(_msg(1, 2, scalars=[(50, 150.0, {"loss": 0.25})], pc=100.3, wall=now))
    assert view.loss.update(s) > 0
    assert view.loss.line(1)[0].tolist() == list(range(51)) and view.loss.line(1)[1][-1] == 0.25
    assert len(view.loss.line(0)[0]) == 50  # each rank's line as long as its data
    assert set(view.loss.choice.options) == {"loss", "samples_per_s"}
    assert "all_reduce" in view.comm.widget.value and view.comm.widget.value.count("<tr>") == 4
    assert "compute" in view.timeline._shown
    # 4 ms calls are narrower than a slot (25 ms), and each still shows: a bar of a
    # slot or two per call (50 ms apart: two may touch and be drawn as one), 40 calls
    # per rank; compute covers the 2 s of calls, plus a second of margin each side
    assert 3 * 20 <= len(view.timeline.bars("all_reduce")) <= 3 * 40
    compute = view.timeline.bars("compute")
    assert len(compute) == 3  # one bar per rank
    assert (compute[:, 1] - compute[:, 0]).tolist() == pytest.approx([3.0] * 3, abs=0.06)
    assert view.status.widget.value.count("busy") == 3
    view.loss.choice.value = "samples_per_s"
    view.loss.update(s)
    assert view.loss.line(0)[1].tolist() == [10.0] * 50
    assert not math.isnan(float(view.loss.line(0)[1][0]))


def _from_top(plot, y: float) -> float:
    """Where value ``y`` lands on the canvas: 0 at the top, 1 at the bottom (_plot.js's ``py``)."""
    y0, y1 = plot.ylim
    return 1.0 - (y - y0) / (y1 - y0)


def test_timeline_puts_rank_0_on_top_with_comm_above_compute():
    """Rank order top to bottom, as trace viewers draw it, in what the browser is sent."""
    s = MetricsStore()
    now = time.time()
    for rank in range(3):
        # a 1 s all_reduce (wider than a slot: drawn), compute before and after it
        comm = [("all_reduce", 64, "mpi", 3, 98.0 + 0.1 * rank, 1.0, 0.5)]
        s.ingest(_msg(rank, 1, comm=comm, pc=100.3, wall=now))
    view = DashboardView(window=10.0)
    view.timeline.update(s, s.ranks())
    plot = view.timeline.plot
    rows = [_from_top(plot, t) for t in plot.yticks]
    assert plot.yticks == [0.0, 1.0, 2.0]
    assert 0.0 < rows[0] < rows[1] < rows[2] < 1.0  # rank 0 is the top row
    drawn = plot.drawn()
    for name in ("all_reduce", "compute"):
        y = drawn[name][1][::2]  # one value per bar
        ranks = np.rint(y).astype(int)
        assert sorted(set(ranks.tolist())) == [0, 1, 2], (name, y)
        for r, yy in zip(ranks, y):
            at = _from_top(plot, yy)
            # within its own rank's row: nearer its tick than any other rank's
            assert np.argmin([abs(at - row) for row in rows]) == r
            if name == "all_reduce":
                assert at < rows[r]  # comm above the rank's axis
            else:
                assert at > rows[r]  # compute below it


def test_timeline_labels_a_rank_whose_first_records_come_after_the_others():
    """Ranks 1-2 are heard from first, then rank 0 (under load its first records can come
    later): rank 0 gets its row's label too, not only the ranks first seen."""
    s = MetricsStore()
    now = time.time()
    view = DashboardView(window=10.0)
    for rank in (1, 2, 0):
        comm = [("all_reduce", 64, "mpi", 3, 98.0, 1.0, 0.5)]
        s.ingest(_msg(rank, 1, comm=comm, pc=100.3, wall=now))
        view.timeline.update(s, s.ranks())
    plot = view.timeline.plot
    assert plot.yticks == [0.0, 1.0, 2.0] and plot.ylim == [2.6, -0.6]


def test_comm_table_keeps_numbers_and_units_on_one_line():
    from html.parser import HTMLParser

    class Cells(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.styles: dict[str, str] = {}
            self.cells: list[str] = []
            self._in = False

        def handle_starttag(self, tag, attrs):
            self.styles.setdefault(tag, dict(attrs).get("style") or "")
            self._in = tag in ("td", "th")
            if self._in:
                self.cells.append("")

        def handle_endtag(self, tag):
            self._in = False

        def handle_data(self, data):
            if self._in:
                self.cells[-1] += data

    s = MetricsStore()
    comm = [("all_reduce", 12_600, "mpi", 2, 100.0, 0.0123, 0.001)] * 3
    comm += [("broadcast", 5_000_000, "mpi", 2, 100.1, 0.25, 0.01)]
    s.ingest(_msg(0, 1, comm=comm))
    view = DashboardView()
    view.comm.update(s)
    page = Cells()
    page.feed(view.comm.widget.value)
    # the stylesheet keeps every number cell on one line (names may wrap)
    assert ".ck-table td,.ck-table th{" in _CSS and "white-space:nowrap}" in _CSS
    assert "overflow-x:auto" in page.styles["div"].replace(" ", "")  # too narrow: it scrolls
    sizes = [c for c in page.cells if c.endswith(("B", "KiB", "MiB", "GiB"))]
    assert sizes == ["36.9\u00a0KiB", "4.8\u00a0MiB"]  # a no-break space to its number


def test_comm_table_names_every_algorithm_an_op_ran_with():
    # What algorithm="auto" picked per size shows up next to the op.
    s = MetricsStore()
    comm = [("all_reduce", 4096, "mpi", 2, 100.0, 1e-5, 0.0)] * 2
    comm += [("all_reduce", 1 << 26, "shm", 2, 100.1, 0.02, 0.0)]
    comm += [("broadcast", 4096, "mpi", 2, 100.2, 1e-5, 0.0)]
    s.ingest(_msg(0, 1, comm=comm))
    rows = {r["op"]: r["algorithms"] for r in s.comm_table()}
    assert rows == {"all_reduce": ["mpi", "shm"], "broadcast": ["mpi"]}
    view = DashboardView()
    view.comm.update(s)
    assert "<div class='ck-alg'>mpi, shm</div>" in view.comm.widget.value  # under the op


def test_comm_table_says_why_auto_ran_each_algorithm():
    # An adapting auto call's record names why: the table's choice plain, a probe, a switch.
    s = MetricsStore()
    comm = [("all_reduce", 1 << 20, "mpi", 2, 100.0, 1e-4, 0.0)]
    comm += [("all_reduce", 1 << 20, "ring (probe)", 2, 100.1, 2e-4, 0.0)]
    comm += [("all_reduce", 1 << 20, "shm (switch)", 2, 100.2, 1e-4, 0.0)]
    s.ingest(_msg(0, 1, comm=comm))
    assert s.comm_table()[0]["algorithms"] == ["mpi", "ring (probe)", "shm (switch)"]
    view = DashboardView()
    view.comm.update(s)
    html_text = view.comm.widget.value
    assert ">mpi, ring (probe), shm (switch)</div>" in html_text
    assert "title='why each algorithm ran" in html_text  # the legend, on hover


def test_thin_always_keeps_the_latest_point():
    x = np.arange(10_000, dtype=float)  # 250 buckets of 40 exactly: no tail
    y = np.cos(x)  # the last point is neither its bucket's min nor its max
    tx, ty = thin(x, y, 500)
    assert tx[0] == 0 and tx[-1] == x[-1] and ty[-1] == y[-1]
    assert len(tx) <= 502 and np.all(np.diff(tx) > 0)


def test_column_messages_keep_every_record_while_lines_are_thinned():
    """What the receiver does: columns in, the full record out, thin lines drawn."""
    s = MetricsStore()
    n, per_msg = 6_000, 1_000
    sent: dict[str, list] = {"scalar": [], "comm": [], "span": []}
    for seq in range(1, n // per_msg + 1):
        steps = range((seq - 1) * per_msg, seq * per_msg)
        msg = _msg(
            0,
            seq,
            scalars=[(i, 100.0 + i, {"loss": 1.0 / (i + 1)}) for i in steps],
            comm=[
                ("all_reduce" if i % 3 else "broadcast", 8, "mpi", 2, 50.0 + i, 0.5, 0.1)
                for i in steps
            ],  # fmt: skip
            spans=[("forward", 49.0 + i, 0.25) for i in steps],
        )
        for kind in sent:
            sent[kind] += [tuple(r) for r in msg[kind]]
        cols = _wire.decode(b"k", _wire.encode(b"k", msg), columns=True)
        assert cols["scalar"]["n"] == per_msg  # columns: one string per distinct op
        assert sorted(cols["comm"]["op"].names) == ["all_reduce", "broadcast"]
        s.ingest(cols)
    got = s.records(ranks=[0])
    for kind in sent:
        mine = [r for r in got if r["kind"] == kind]
        assert len(mine) == n
    assert [(r["step"], r["time"], r["values"]) for r in got if r["kind"] == "scalar"] == [
        (st, t, v) for st, t, v in sent["scalar"]
    ]
    assert [tuple(r[f] for f in ("op", "nbytes", "algorithm", "group_size", "start", "duration", "wait"))
            for r in got if r["kind"] == "comm"] == sent["comm"]  # fmt: skip
    table = {row["op"]: row for row in s.comm_table()}
    assert table["broadcast"]["count"] == n // 3 and table["all_reduce"]["count"] == n - n // 3
    assert table["all_reduce"]["seconds"] == pytest.approx(0.5 * (n - n // 3))
    assert s.status()[0]["records"] == {"comm": n, "scalar": n, "span": n}
    steps, loss = s.series("loss")[0]
    assert steps.tolist() == list(range(n)) and loss[-1] == 1.0 / n

    view = DashboardView(max_points=500)
    assert view.loss.update(s) > 0
    x, y = view.loss.line(0)
    assert len(x) <= 502 and x[-1] == n - 1 and y[-1] == 1.0 / n
    assert view.loss.update(s) == 0  # nothing new: nothing sent
    plot = view.loss.plot
    (x0, x1), (y0, y1) = plot.xlim, plot.ylim
    assert (x0, x1) == (0, n - 1) and y0 < 1.0 / n and y1 > 1.0  # the steps drawn, no more
    ylim = plot.ylim
    s.ingest(_msg(0, 7, scalars=[(n, 200.0, {"loss": 0.5})]))
    assert view.loss.update(s) > 0
    x, y = view.loss.line(0)
    assert x[-1] == n and y[-1] == 0.5
    assert plot.xlim == [0, n] and plot.ylim == ylim  # a value inside: the value axis stays
    s.ingest(_msg(0, 8, scalars=[(10 * n, 300.0, {"loss": -3.0})]))
    view.loss.update(s)
    assert plot.xlim == [0, 10 * n] and plot.ylim[0] < -3.0  # outside: it grows
    assert len(s.series("loss")[0][0]) == n + 2  # the record is never thinned


def test_dashboard_without_ranks_says_how_to_start_them():
    with pytest.raises(ClusterError, match="%mpi start -n 4"):
        Dashboard()


def test_recorder_read_is_by_absolute_index_and_reports_trimmed_records():
    rec = metrics.Recorder(rank=0, capacity=4)
    for i in range(3):
        rec.log(step=i, loss=float(i))
    items, nxt, lost = rec.read("scalar", 0)
    assert [t[0] for t in items] == [0, 1, 2] and nxt == 3 and lost == 0
    for i in range(3, 6):
        rec.log(step=i, loss=float(i))  # passes capacity 4: the oldest half goes
    assert rec.total("scalar") == 6
    items, nxt, lost = rec.read("scalar", 3)
    assert [t[0] for t in items] == [3, 4, 5] and nxt == 6 and lost == 0
    items, nxt, lost = rec.read("scalar", 0, limit=1)
    assert lost == 2 and [t[0] for t in items] == [2] and nxt == 3  # steps 0-1 were trimmed
    assert [r["step"] for r in rec.drain("scalar")] == [2, 3, 4, 5]  # drain is independent
    rec.clear()
    rec.log(step=9, loss=1.0)
    items, nxt, lost = rec.read("scalar", 6)
    assert [t[0] for t in items] == [9] and nxt == 7


def test_comm_table_shows_blocked_time_only_where_it_differs_from_total():
    sync = MetricsStore()  # sync calls block throughout: the column would repeat total
    sync.ingest(_msg(0, 1, comm=[("all_reduce", 64, "mpi", 2, 100.0, 0.01, 0.01)] * 3))
    view = DashboardView()
    view.comm.update(sync)
    assert "total s" in view.comm.widget.value and "blocked s" not in view.comm.widget.value
    assert "blocked s" not in summary(sync)
    overlapped = MetricsStore()  # an async call that ran 10 ms, waited on for 2 ms
    overlapped.ingest(_msg(0, 1, comm=[("all_reduce", 64, "mpi", 2, 100.0, 0.01, 0.002)]))
    view = DashboardView()
    view.comm.update(overlapped)
    assert "<th>blocked s</th>" in view.comm.widget.value
    assert "<td>0.0020</td>" in view.comm.widget.value
    assert "blocked s" in summary(overlapped)


def test_throughput_from_logged_sample_counts():
    s = MetricsStore()
    # 64 samples every 0.5 s on rank 0; batch_size every 0.25 s, in two messages, on rank 1
    s.ingest(
        _msg(0, 1, scalars=[(i, 100.0 + 0.5 * i, {"loss": 1.0, "samples": 64}) for i in range(4)])
    )
    s.ingest(_msg(1, 1, scalars=[(0, 100.0, {"batch_size": 32}), (1, 100.25, {"loss": 1.0})]))
    s.ingest(_msg(1, 2, scalars=[(2, 100.5, {"batch_size": 32})]))
    speed = s.series("samples_per_s")
    assert speed[0][0].tolist() == [1, 2, 3] and speed[0][1].tolist() == pytest.approx([128.0] * 3)
    assert speed[1][0].tolist() == [2] and speed[1][1].tolist() == pytest.approx([64.0])
    view = DashboardView()
    assert view.throughput.update(s) > 0
    # a loop that logs samples_per_s itself keeps its own figures
    own = MetricsStore()
    own.ingest(_msg(0, 1, scalars=[(0, 100.0, {"samples": 64, "samples_per_s": 7.0}),
                                   (1, 101.0, {"samples": 64, "samples_per_s": 7.0})]))  # fmt: skip
    assert own.series("samples_per_s")[0][1].tolist() == [7.0, 7.0]


def test_timeline_keeps_the_last_window_once_the_ranks_go_quiet():
    s = MetricsStore()
    now = time.time()
    # a 2 s all_reduce that ended 30 s ago (wall = pc + offset; pc 100.3 is "now - 28")
    s.ingest(
        _msg(0, 1, comm=[("all_reduce", 64, "mpi", 1, 96.3, 2.0, 2.0)], pc=100.3, wall=now - 28)
    )
    view = DashboardView(window=10.0)
    view.timeline.update(s, s.ranks())
    bars = view.timeline.bars("all_reduce")
    assert len(bars) == 1 and (bars[0, 1] - bars[0, 0]) == pytest.approx(2.0, abs=0.06)
    assert bars[0, 1] == pytest.approx(-1.0, abs=0.06)  # it ended a second before the end
    assert view.timeline.plot.xlabel == "seconds before the ranks went quiet"
    s.ingest(_msg(0, 2, comm=[("all_reduce", 64, "mpi", 1, 128.0, 0.5, 0.5)], pc=128.5, wall=now))
    view.timeline.update(s, s.ranks())
    assert view.timeline.plot.xlabel == "seconds ago"  # live again: it scrolls
