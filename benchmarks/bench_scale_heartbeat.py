"""What does the heartbeat period cost an idle cluster (and buy at start)?

    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_scale_heartbeat.py \
        --periods 500 3000 200 --ranks 32

(issue 11.) For each period in turn, one ``Cluster(n)`` with
``clusterkernel.client.launch._engine_set.HEARTBEAT_MS`` patched in this process: its start time,
then ``--idle`` seconds idle right after start and again after ``--cells`` empty cells,
reading the CPU (psutil ``cpu_times``, user + system) of the controller with its
schedulers and of the MPI job (mpiexec, prterun, engines, nannies); the busiest process;
and the empty cell's wall time. One start per period: single runs, no rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402
import psutil  # noqa: E402
from _scale import CkSide  # noqa: E402

from clusterkernel import Cluster  # noqa: E402
from clusterkernel.client.output import TerminalRenderer  # noqa: E402


def _groups(cluster: Cluster) -> dict[str, list]:
    ipc = cluster._engines.ipp
    assert ipc is not None
    engines = [lc.pid for lc in ipc.engines.values() if getattr(lc, "pid", None)]
    return {"controller": h.tree([ipc.controller.pid]), "MPI job": h.tree(engines)}


def _idle_by_group(cluster: Cluster, seconds: float) -> dict:
    """CPU % of one core per process group over ``seconds`` of idling, and the top process."""
    groups = _groups(cluster)
    procs = [p for g in groups.values() for p in g]
    before = {p.pid: h.cpu_seconds([p]) for p in procs}
    time.sleep(seconds)
    used = {p.pid: h.cpu_seconds([p]) - before[p.pid] for p in procs}
    out: dict = {k: 100 * sum(used[p.pid] for p in g) / seconds for k, g in groups.items()}
    top = max(procs, key=lambda p: used[p.pid])
    with contextlib.suppress(psutil.Error):
        out["top"] = f"{top.name()} {100 * used[top.pid] / seconds:.1f} %"
    return out


def heartbeat(n: int, periods: list[int], seconds: float, cells: int) -> dict:
    from clusterkernel.client.cluster import _launch

    res = {}
    saved = _launch.HEARTBEAT_MS
    for ms in periods:
        _launch.HEARTBEAT_MS = ms
        side = CkSide(n)
        try:
            t = side.start()
            c = side.cluster
            assert c is not None
            time.sleep(1.0)
            fresh = _idle_by_group(c, seconds)
            w0 = time.perf_counter()
            for _ in range(cells):
                c.run("pass", renderer=TerminalRenderer(c.ranks, stream=io.StringIO()))
            per_cell = (time.perf_counter() - w0) / max(cells, 1)
            time.sleep(1.0)
            after = _idle_by_group(c, seconds)
            res[ms] = {"start": t, "fresh": fresh, "after": after, "cell": per_cell}
            print(f"[heartbeat {ms} ms] {res[ms]}", flush=True)
        finally:
            _launch.HEARTBEAT_MS = saved
            side.stop()
    return res


def report(res: dict, n: int, seconds: float, cells: int) -> None:
    print(
        f"\nheartbeat, Cluster(n={n}) idle {seconds:g} s: CPU % of one core (fresh | after "
        f"{cells} empty cells)"
    )
    print("| heartbeat | start s | controller | MPI job | busiest process | empty cell ms |")
    print("|---|---|---|---|---|---|")
    for ms, d in res.items():
        f, a = d["fresh"], d["after"]
        print(
            f"| {ms} ms | {d['start']:.1f} | {f['controller']:.1f} \\| {a['controller']:.1f} "
            f"| {f['MPI job']:.1f} \\| {a['MPI job']:.1f} | {f.get('top')} \\| {a.get('top')} "
            f"| {1e3 * d['cell']:.1f} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--periods", type=int, nargs="+", default=[500, 3000, 200], metavar="MS")
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds idle, each time")
    ap.add_argument("--cells", type=int, default=40, help="empty cells between the two idles")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    with h.mpi_lock():
        print(f"load average {h.load():.1f}")
        res = heartbeat(args.ranks, args.periods, args.idle, args.cells)
        print(f"load average {h.load():.1f}")
    report(res, args.ranks, args.idle, args.cells)
    if args.json:
        args.json.write_text(json.dumps(res))


if __name__ == "__main__":
    main()
