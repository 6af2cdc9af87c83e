"""Save a run so it can be looked at later: CSV, JSON, Chrome trace, PNG.

- ``scalars.csv``: one row per rank and step, one column per logged name;
  ``comm.csv``: one row per communication call.
- ``metrics.json``: every record (the shapes of :mod:`clusterkernel.protocol.records`)
  plus each rank's clock offset.
- ``timeline.json``: Chrome trace-event format (open it in https://ui.perfetto.dev
  or chrome://tracing): one process per rank, a ``comm`` and a ``compute`` track.
- ``dashboard.png``: matplotlib figure of the same panels (Agg, no GUI needed).
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

from clusterkernel.client.dashboard._store import MetricsStore
from clusterkernel.protocol.records import COMM_FIELDS


def _unmeasured(rec: dict) -> dict:
    """A comm record whose blocked time was not measured (NaN ``wait``, as torch's DDP
    buckets) with ``wait`` None: JSON null, an empty CSV cell, never a made-up 0."""
    w = rec.get("wait")
    return {**rec, "wait": None} if isinstance(w, float) and math.isnan(w) else rec


def to_csv(store: MetricsStore, path: str | os.PathLike, kind: str = "scalar") -> Path:
    """Write ``scalar`` records (wide: one column per name) or ``comm`` records as CSV."""
    path = Path(path)
    if kind == "scalar":
        recs = store.records("scalar")
        names = sorted({n for r in recs for n in r["values"]})
        with open(path, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["rank", "step", "time", *names])
            for r in recs:
                out.writerow(
                    [r["rank"], r["step"], r["time"], *(r["values"].get(n, "") for n in names)]
                )
    elif kind == "comm":
        with open(path, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["rank", *COMM_FIELDS])
            for r in map(_unmeasured, store.records("comm")):
                out.writerow([r["rank"], *("" if r[k] is None else r[k] for k in COMM_FIELDS)])
    else:
        raise ValueError(f"to_csv writes kind 'scalar' or 'comm', not {kind!r}")
    return path


def to_json(store: MetricsStore, path: str | os.PathLike) -> Path:
    """Every record plus each rank's ``wall - perf_counter`` offset, as one JSON file."""
    path = Path(path)
    doc = {
        "records": [_unmeasured(r) for r in store.records()],
        "wall_offset": {str(r): store.wall_offset(r) for r in store.ranks()},
    }
    path.write_text(json.dumps(doc))
    return path


def chrome_trace(store: MetricsStore) -> dict:
    """The comm calls and compute spans as a Chrome trace-event document."""
    offsets = {r: store.wall_offset(r) for r in store.ranks()}
    recs = [_unmeasured(r) for r in store.records() if r["kind"] in ("comm", "span")]
    if not recs:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    t0 = min(r["start"] + offsets[r["rank"]] for r in recs)
    events: list[dict] = []
    for rank in offsets:
        events.append(
            {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}}
        )
        for tid, name in ((0, "compute"), (1, "comm")):
            events.append(
                {"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}}
            )
    for r in recs:
        ts = (r["start"] + offsets[r["rank"]] - t0) * 1e6
        if r["kind"] == "comm":
            args = {k: r[k] for k in ("nbytes", "algorithm", "group_size", "wait")}
            name, tid = r["op"], 1
        else:
            args, name, tid = {}, r["name"], 0
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": r["kind"],
                "pid": r["rank"],
                "tid": tid,
                "ts": ts,
                "dur": r["duration"] * 1e6,
                "args": args,
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def to_chrome_trace(store: MetricsStore, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(store)))
    return path


def to_png(store: MetricsStore, path: str | os.PathLike, metric: str = "loss") -> Path:
    """Loss, throughput, comm time per op and the whole timeline, as one PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from clusterkernel.client.dashboard._colors import rank_color

    path = Path(path)
    fig = Figure(figsize=(12, 8), layout="constrained")
    canvas = FigureCanvasAgg(fig)
    ax_loss, ax_tp, ax_comm, ax_tl = fig.subplots(2, 2).ravel()
    for ax, name in ((ax_loss, metric), (ax_tp, "samples_per_s")):
        for rank, (x, y) in store.series(name).items():
            ax.plot(x, y, color=rank_color(rank), label=f"rank {rank}", lw=1)
        ax.set(title=f"{name} per rank", xlabel="step", ylabel=name)
        if ax.lines:
            ax.legend(fontsize="small")
    rows = store.comm_table()
    ops = sorted({r["op"] for r in rows})
    ranks = sorted({r["rank"] for r in rows})
    width = 0.8 / max(len(ranks), 1)
    for i, rank in enumerate(ranks):
        secs = {r["op"]: r["seconds"] for r in rows if r["rank"] == rank}
        xs = [j + i * width for j in range(len(ops))]
        ax_comm.bar(xs, [secs.get(op, 0.0) for op in ops], width, color=rank_color(rank))
    ax_comm.set_xticks([j + 0.4 - width / 2 for j in range(len(ops))], ops, rotation=30)
    ax_comm.set(title="seconds per communication op", ylabel="seconds")
    lanes: dict[tuple[float, str], list] = {}
    for ev in chrome_trace(store)["traceEvents"]:
        if ev["ph"] == "X":
            lane = ev["pid"] + (0.2 if ev["tid"] == 1 else -0.2)
            color = "#d62728" if ev["tid"] == 1 else "#1f77b4"
            lanes.setdefault((lane, color), []).append((ev["ts"] / 1e6, ev["dur"] / 1e6))
    for (lane, color), bars in lanes.items():
        ax_tl.broken_barh(bars, (lane - 0.15, 0.3), color=color)
    ax_tl.set(title="timeline (red: comm, blue: compute)", xlabel="seconds", ylabel="rank")
    canvas.print_png(str(path))
    return path


def export(
    store: MetricsStore, directory: str | os.PathLike, metric: str = "loss"
) -> dict[str, Path]:
    """Write all five files into ``directory`` (created if missing); return their paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    return {
        "scalars_csv": to_csv(store, d / "scalars.csv", "scalar"),
        "comm_csv": to_csv(store, d / "comm.csv", "comm"),
        "json": to_json(store, d / "metrics.json"),
        "chrome_trace": to_chrome_trace(store, d / "timeline.json"),
        "png": to_png(store, d / "dashboard.png", metric),
    }
