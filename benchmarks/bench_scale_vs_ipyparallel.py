"""How do start, restart, an empty and a print cell at 4-32 ranks compare with raw ipyparallel?

    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_scale_vs_ipyparallel.py
    .venv/bin/python benchmarks/bench_scale_vs_ipyparallel.py --sizes 4 16 --rounds 2 \
        --idle-sizes

(issue 11; the defaults take about 11 minutes.) One cluster at a time (start, measure,
restart, stop), never two at once. At each size, in turn:

- ``clusterkernel``: ``Cluster(n).start()`` in this process; cells on its engines,
  ways interleaved in rounds (A B C D E A B C D E ...): ``cluster.run(code)`` (the
  ``%%mpi`` path, a ``TerminalRenderer`` on an ``io.StringIO``), ``%%px`` (a real
  IPython ``InteractiveShell`` with ipyparallel's magics, ``client.activate()``),
  ``%%px`` once more (the A/A control), ``client[:].execute(code, block=True)`` and,
  with ``--broadcast``, the EXPERIMENT ``cluster.run`` with ``Cluster.view`` patched
  here to return ipyparallel's BroadcastView (interleaved with the others it kept the
  controller busy for a whole core at 16 ranks, slowing every way: off by default);
  then ``cluster.restart()``. These ways share this
  process and so clusterkernel's adaptation of ipyparallel's client (the reply-date
  parser installed at start): like with like;
- ``raw``: ``ipyparallel.Cluster(engines="mpi", n=n)`` with its default configuration
  (heartbeat 3 s) **in a worker process that never imports clusterkernel**
  (``_raw_ipp.py``, checked on every reply): ``start_and_connect_sync()`` +
  ``wait_for_engines(n)``; ``%%px`` and ``execute`` cells; restart =
  ``stop_engines_sync()``, wait for the old engines to unregister,
  ``start_engines_sync(n)`` + ``wait_for_engines(n)``;
- ``raw200``: the same with the controller's heartbeat at 200 ms
  (``--HeartMonitor.period=200``): start and restart only.

Raw ipyparallel gets the very MPI job clusterkernel starts (``_scale.mpi_job``).

Per cell: wall time and the notebook process's CPU time (``time.process_time()``: every
thread, ipyparallel's IO thread included; ``time.thread_time()`` for the calling thread
alone). ``run / %%px`` is a paired ratio (per round, its middle half in brackets) read
against the A/A control (``%%px again / %%px``). At the sizes in ``--idle-sizes`` each
cluster also sits idle ``--idle`` seconds while the CPU time of its controller and MPI
job is read (the heartbeat's cost: 500 / 3000 / 200 ms).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402
from _scale import (  # noqa: E402
    CELLS,
    CkSide,
    RawSide,
    cell_stats,
    fmt_cells,
    measure_cells,
    round_medians,
)


def run_sizes(args) -> dict:
    res: dict = {"sizes": {}, "load_before": h.load()}
    for n in args.sizes:
        rounds = args.rounds if n <= 16 else max(2, args.rounds // 2)
        starts = args.starts if n <= 4 else max(1, args.starts - (1 if n <= 16 else 2))
        r: dict = {"start": {}, "restart": {}, "cells": {}, "idle": {}, "load": []}
        for rep in range(starts):
            for kind, kw in ((CkSide, {}), (RawSide, {}), (RawSide, {"heartbeat_ms": 200})):
                side = kind(n, **kw)
                try:
                    t = side.start()
                    r["start"].setdefault(side.name, []).append(t)
                    print(f"[{n} ranks] {side.name} start {t:.2f} s", flush=True)
                    if rep == 0 and isinstance(side, CkSide):
                        ways = side.ways(aa=True, broadcast=args.broadcast)
                        r["cells"][side.name] = measure_cells(ways, rounds, args.cells)
                        r["output_check"] = side.check_print_output(args.broadcast)
                    elif rep == 0 and side.name == "raw":
                        r["cells"]["raw"] = side.cells(["px", "execute"], rounds, args.cells)
                    if rep == 0 and n in args.idle_sizes:
                        r["idle"][side.name] = {
                            **side.idle(args.idle),
                            "heartbeat_ms": side.heartbeat_ms,
                        }
                    t = side.restart()
                    r["restart"].setdefault(side.name, []).append(t)
                    print(f"[{n} ranks] {side.name} restart {t:.2f} s", flush=True)
                finally:
                    side.stop()
                r["load"].append(h.load())
        res["sizes"][n] = r
    res["load_after"] = h.load()
    return res


def report(res: dict) -> None:
    sizes = sorted(res["sizes"], key=int)
    print(f"\nload average before {res['load_before']:.1f}, after {res['load_after']:.1f}")
    print("\nStart and restart (median, seconds; every run in brackets):")
    print(
        "| ranks | clusterkernel start | raw start (3 s heartbeat) | raw start (200 ms) "
        "| ck / raw | ck / raw200 | ck restart | raw restart | raw200 restart "
        "| ck / raw | ck / raw200 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        r = res["sizes"][n]
        row = [str(n)]
        for what in ("start", "restart"):
            t = {k: r[what].get(k, []) for k in ("clusterkernel", "raw", "raw200")}
            m = {k: h.median(v) for k, v in t.items()}
            row += [f"{m[k]:.2f} ({', '.join(f'{x:.1f}' for x in t[k])})" for k in t]
            row += [
                f"{m['clusterkernel'] / m['raw']:.2f}x",
                f"{m['clusterkernel'] / m['raw200']:.2f}x",
            ]
        print("| " + " | ".join(row) + " |")

    for kind in CELLS:
        print(
            f"\n{kind} cell ({CELLS[kind]!r}): wall ms, median of all cells [lowest-highest "
            "round median]; run / %%px and the A/A control: paired per round [middle half]; "
            "the rest ratios of medians"
        )
        print(
            "| ranks | `cluster.run` | `%%px` | `execute` | run / %%px | A/A: %%px again / %%px "
            "| within noise | run / execute | exp. B: broadcast | B / %%px "
            "| raw process: `%%px` | raw process: `execute` | run / raw `%%px` |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for n in sizes:
            ck = res["sizes"][n]["cells"]["clusterkernel"][kind]
            raw = res["sizes"][n]["cells"]["raw"][kind]
            s = {w: cell_stats(v, 0) for w, v in ck.items()}
            sr = {w: cell_stats(v, 0) for w, v in raw.items()}
            rm = {w: round_medians(v) for w, v in ck.items()}
            ratio = h.paired(rm["mpi"], rm["px"])
            aa = h.paired(rm["px again"], rm["px"])
            px = s["px"][0]
            b = s.get("mpi+broadcast", (float("nan"),) * 3)
            print(
                f"| {n} | {fmt_cells(s['mpi'])} | {fmt_cells(s['px'])} | {fmt_cells(s['execute'])} "
                f"| {h.fmt_ratio(ratio)} | {h.fmt_ratio(aa)} | {h.aa_verdict(ratio, aa)} "
                f"| {s['mpi'][0] / s['execute'][0]:.2f}x "
                f"| {fmt_cells(b)} | {b[0] / px:.2f}x "
                f"| {fmt_cells(sr['px'])} | {fmt_cells(sr['execute'])} "
                f"| {s['mpi'][0] / sr['px'][0]:.2f}x |"
            )
        print(f"\n{kind} cell: notebook process CPU ms per cell, median (calling thread alone)")
        print(
            "| ranks | `cluster.run` | `%%px` | `execute` | exp. B: broadcast "
            "| raw process: `%%px` | raw process: `execute` | run / %%px | B / %%px "
            "| run / raw `%%px` |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for n in sizes:
            ck = res["sizes"][n]["cells"]["clusterkernel"][kind]
            raw = res["sizes"][n]["cells"]["raw"][kind]
            nan = [[(float("nan"),) * 3]]
            ck = {"mpi+broadcast": nan, **ck}
            c = {w: cell_stats(v, 1)[0] for w, v in ck.items()}
            t = {w: cell_stats(v, 2)[0] for w, v in ck.items()}
            cr = {w: cell_stats(v, 1)[0] for w, v in raw.items()}
            tr = {w: cell_stats(v, 2)[0] for w, v in raw.items()}
            cols = [f"{c[w]:.1f} ({t[w]:.1f})" for w in ("mpi", "px", "execute", "mpi+broadcast")]
            cols += [f"{cr[w]:.1f} ({tr[w]:.1f})" for w in ("px", "execute")]
            cols += [f"{c[w] / c['px']:.2f}x" for w in ("mpi", "mpi+broadcast")]
            cols += [f"{c['mpi'] / cr['px']:.2f}x"]
            print(f"| {n} | " + " | ".join(cols) + " |")

    idle = [(n, res["sizes"][n]["idle"]) for n in sizes if res["sizes"][n]["idle"]]
    for n, by in idle:
        print(f"\nidle {n} ranks: CPU of controller + MPI job while idle (heartbeat)")
        print("| cluster | heartbeat | CPU % of one core | processes |")
        print("|---|---|---|---|")
        for name, d in sorted(by.items(), key=lambda kv: kv[1]["heartbeat_ms"]):
            pct = 100 * d["cpu_s"] / d["wall_s"]
            print(f"| {name} | {d['heartbeat_ms']} ms | {pct:.1f} % | {d['processes']} |")
    for n in sizes:
        chk = res["sizes"][n].get("output_check")
        if chk:
            print(f"print cell output per rank correct at {n} ranks: {chk}")
    print("raw ipyparallel ran in a worker process that never imported clusterkernel (checked)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32], help="ranks")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of cells (halved above 16)")
    ap.add_argument("--cells", type=int, default=20, help="cells per way per round")
    ap.add_argument(
        "--starts",
        type=int,
        default=3,
        help="start+restart cycles per side at 4 ranks (one fewer up to 16, two fewer above)",
    )
    ap.add_argument("--idle", type=float, default=10.0, help="seconds idle for the heartbeat")
    ap.add_argument("--idle-sizes", type=int, nargs="*", default=[32])
    ap.add_argument(
        "--broadcast",
        action="store_true",
        help="also the EXPERIMENT: cluster.run through a BroadcastView (exp. B columns)",
    )
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    with h.mpi_lock():
        res = run_sizes(args)
    report(res)
    if args.json:
        args.json.write_text(json.dumps(res))


if __name__ == "__main__":
    main()
