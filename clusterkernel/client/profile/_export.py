"""A profile as files other tools open: speedscope JSON and a Chrome trace.

- **speedscope** (https://www.speedscope.app, offline too: ``npm i -g speedscope``):
  one sampled profile per rank and thread, samples in time order with their
  seconds as weights, frames named ``function`` with ``file`` and ``line`` (a cell's
  file is the cell as the notebook numbers it, ``Cell In[7]``, as in the tables; the
  main thread's time between cells is one frame, ``(between cells)``).
- **Chrome trace** (https://ui.perfetto.dev, chrome://tracing): one process per rank,
  a track per sampled thread whose nested boxes are the stacks over time (each box's
  ``args``: its ``file``, ``Cell In[7]`` for a cell, and ``line``), the comm
  calls of the cell on a track of their own with their wait split (``args``), and
  torch's CPU ops (``--profile torch``) on another; every rank on one wall clock.
  With a dashboard's store the dashboard's comm and compute tracks are merged in.

Example::

    profile.save("step.speedscope.json")   # by suffix: .speedscope.json or .json (Chrome)
    doc = chrome_trace(profile.ranks)       # {"traceEvents": [...], ...}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from clusterkernel.client.profile._flame import cell_file

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"
_BETWEEN = ("", 0, "(between cells)")
# Chrome trace thread ids per rank (the dashboard's own are 0: compute, 1: comm)
_TID_COMM, _TID_TORCH, _TID_THREADS = 2, 3, 10


def _runs(data: dict, thread: str) -> list[tuple[list, float]]:
    """One thread's samples in time order as (stack, seconds); the totals when the
    timeline is missing or was cut short."""
    stacks = data.get("stacks", [])
    timeline = (data.get("timeline") or {}).get(thread)
    if timeline and not data.get("truncated"):
        return [(stacks[i][1], secs) for i, _start, secs in timeline]
    return [(stack, secs) for t, stack, secs in stacks if t == thread]


def _threads(data: dict) -> list[str]:
    names = {t for t, _s, _x in data.get("stacks", [])}
    return sorted(names, key=lambda t: (t != "main", t))


def speedscope(ranks: dict[int, dict], name: str = "clusterkernel profile") -> dict:
    """The speedscope file format document of ``{rank: data}``."""
    frames: list[dict] = []
    index: dict[tuple, int] = {}

    def frame(f: list | tuple) -> int:
        key = (cell_file(f[0]), int(f[1] or 0), f[2])
        i = index.get(key)
        if i is None:
            i = index[key] = len(frames)
            frames.append(
                {"name": key[2], "file": key[0], "line": key[1]} if key[0] else {"name": key[2]}
            )
        return i

    profiles = []
    for rank, data in sorted(ranks.items()):
        for thread in _threads(data):
            samples, weights = [], []
            for stack, secs in _runs(data, thread):
                samples.append([frame(f) for f in stack] if stack else [frame(_BETWEEN)])
                weights.append(secs)
            profiles.append(
                {
                    "type": "sampled",
                    "name": f"rank {rank}" + ("" if thread == "main" else f" thread {thread}"),
                    "unit": "seconds",
                    "startValue": 0,
                    "endValue": sum(weights),
                    "samples": samples,
                    "weights": weights,
                }
            )
    return {
        "$schema": SPEEDSCOPE_SCHEMA,
        "shared": {"frames": frames},
        "profiles": profiles,
        "name": name,
        "activeProfileIndex": 0,
        "exporter": "clusterkernel",
    }


def _stack_events(data: dict, thread: str, pid: int, tid: int, origin: float) -> list[dict]:
    """A thread's timeline as nested complete ("X") events: a frame stays open while
    consecutive samples keep it (same file, function and line) at its depth."""
    timeline = (data.get("timeline") or {}).get(thread) or []
    stacks = data.get("stacks", [])
    base = (data.get("wall0", 0.0) - origin) * 1e6
    out: list[dict] = []
    open_: list[tuple[tuple, float]] = []  # (frame, start us)

    def close(upto: int, at: float) -> None:
        while len(open_) > upto:
            (file, line, func), start = open_.pop()
            out.append(
                {
                    "ph": "X",
                    "name": func,
                    "cat": "python",
                    "pid": pid,
                    "tid": tid,
                    "ts": start,
                    "dur": max(at - start, 0.0),
                    "args": {"file": file, "line": line},
                }
            )

    end = base
    for i, start, secs in timeline:
        at = base + start * 1e6
        stack = [(cell_file(f[0]), int(f[1] or 0), f[2]) for f in stacks[i][1]]
        keep = 0
        while keep < min(len(stack), len(open_)) and open_[keep][0] == stack[keep]:
            keep += 1
        close(keep, at)
        open_.extend((f, at) for f in stack[keep:])
        end = at + secs * 1e6
    close(0, end)
    return out


def _comm_events(data: dict, pid: int, origin: float) -> list[dict]:
    offset = data.get("wall0", 0.0) - data.get("t0", 0.0)
    out = []
    for op, nbytes, alg, gsize, start, dur, wait in data.get("comm") or []:
        out.append(
            {
                "ph": "X",
                "name": op,
                "cat": "comm",
                "pid": pid,
                "tid": _TID_COMM,
                "ts": (start + offset - origin) * 1e6,
                "dur": dur * 1e6,
                "args": {
                    "nbytes": nbytes,
                    "algorithm": alg,
                    "group_size": gsize,
                    "wait": None if wait != wait else wait,
                },
            }
        )
    return out


def _torch_events(data: dict, pid: int, origin: float) -> list[dict]:
    """torch.profiler's CPU ops (``--profile torch``), already on this rank's wall clock."""
    out = []
    for ev in data.get("torch") or []:
        out.append({**ev, "pid": pid, "tid": _TID_TORCH, "ts": ev["ts"] - origin * 1e6})
    return out


def origin_of(ranks: dict[int, dict]) -> float:
    """The wall time the trace's zero stands for: the earliest rank's start."""
    return min((d.get("wall0", 0.0) for d in ranks.values()), default=0.0)


def chrome_trace(ranks: dict[int, dict], store: Any = None) -> dict:
    """The Chrome trace-event document of ``{rank: data}`` (one process per rank),
    with a dashboard's ``MetricsStore`` merged in on the same clock when given."""
    origin = origin_of(ranks)
    events: list[dict] = []
    if store is not None:
        events += _dashboard_events(store, origin)
    for rank, data in sorted(ranks.items()):
        events.append(
            {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}}
        )
        # the dashboard's trace has the comm calls already (its tid 1)
        names = [] if store is not None else [(_TID_COMM, "comm calls (profiled cell)")]
        if data.get("torch"):
            names.append((_TID_TORCH, "torch ops"))
        for k, thread in enumerate(_threads(data)):
            tid = _TID_THREADS + k
            names.append((tid, f"python {thread}"))
            events += _stack_events(data, thread, rank, tid, origin)
        for tid, name in names:
            events.append(
                {"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}}
            )
        if store is None:
            events += _comm_events(data, rank, origin)
        events += _torch_events(data, rank, origin)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"wall0": origin}}


def _dashboard_events(store: Any, origin: float) -> list[dict]:
    """The dashboard's own trace (``dashboard._export.chrome_trace``) moved onto this
    trace's zero: it counts from its earliest record's wall time."""
    from clusterkernel.client.dashboard._export import chrome_trace as dashboard_trace

    recs = [r for r in store.records() if r["kind"] in ("comm", "span")]
    if not recs:
        return []
    t0 = min(r["start"] + store.wall_offset(r["rank"]) for r in recs)
    shift = (t0 - origin) * 1e6
    out = []
    for ev in dashboard_trace(store)["traceEvents"]:
        out.append({**ev, "ts": ev["ts"] + shift} if "ts" in ev else ev)
    return out


def save_files(ranks: dict[int, dict], stem: str | os.PathLike) -> list[Path]:
    """Both files of ``{rank: data}``: ``<stem>.speedscope.json`` and ``<stem>.trace.json``
    (Chrome/Perfetto), as an exported job's ``--profile`` writes them at its end.

    Example::

        save_files(ranks, "/home/me/job")   # [.../job.speedscope.json, .../job.trace.json]
    """
    return [save(ranks, f"{stem}.speedscope.json"), save(ranks, f"{stem}.trace.json")]


def save(ranks: dict[int, dict], path: str | os.PathLike, store: Any = None) -> Path:
    """Write ``path``: speedscope for ``*.speedscope.json``, else a Chrome trace."""
    path = Path(path)
    if path.name.endswith(".speedscope.json"):
        doc = speedscope(ranks)
    elif path.suffix == ".json":
        doc = chrome_trace(ranks, store)
    else:
        raise ValueError(
            f"save() writes NAME.speedscope.json (speedscope) or NAME.json (Chrome/Perfetto "
            f"trace), not {path.name!r}"
        )
    path.write_text(json.dumps(doc))
    return path
