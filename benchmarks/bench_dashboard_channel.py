"""Does the metric stream slow a rank's logging loop, and how much does the notebook see, vs ipyparallel's publish_data?

    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_dashboard_channel.py --rounds 2

(issue 6.) 4 ranks, no browser: every rank logs ``--steps`` scalars in a tight loop
(the worst case for a stream; and again with ``--work-us`` of busy work per step) while
the notebook side collects them, the variants interleaved in ``--rounds`` rounds in one
cluster:

- ``none``     no stream: the loop's own speed;
- ``zmq``      clusterkernel's channel (``metrics.stream``: signed batches of binary
               columns over a ZMQ PUSH socket per rank, sent from a thread; the
               recorder is the buffer);
- ``datapub``  ipyparallel's ``publish_data`` from a thread on each rank, 10 times a
               second, each message a window of the last ``--window`` records with a
               sequence number; the notebook reads ``ar.data`` 5 times a second
               (``data_message`` keeps only the latest value per key).

Reported: loop steps/s per rank (median of ranks, then of rounds) and against ``none``,
the share of (rank, step) points the notebook had when the cell ended ("live") and after
waiting ("final").
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402
from _dashboard_bed import Quiet  # noqa: E402

LOOP = """
import time
from clusterkernel import metrics
rec = metrics.recorder()
rec.clear()
_t0 = time.perf_counter()
for _i in range({steps}):
    _end = time.perf_counter() + {work}
    while time.perf_counter() < _end:  # the step's own work (0: log only)
        pass
    metrics.log(step=_i, loss=1.0 / (_i + 1), samples_per_s=float(_i))
bench_loop_s = time.perf_counter() - _t0
"""

DATAPUB_START = """
import threading, time
from ipyparallel.datapub import publish_data
from clusterkernel import metrics

def _datapub(stop, window):
    rec, seq = metrics.recorder(), 0
    while not stop.wait(0.1):
        items, nxt, _ = rec.read("scalar", max(rec.total("scalar") - window, 0))
        seq += 1
        publish_data({{"ck": {{"seq": seq, "steps": [s for s, _t, _v in items]}}}})

bench_stop = threading.Event()
bench_thread = threading.Thread(target=_datapub, args=(bench_stop, {window}), daemon=True)
bench_thread.start()
"""

DATAPUB_STOP = "bench_stop.set(); bench_thread.join()"


def _collect_datapub(run, seen: set, stop: threading.Event, ranks: list[int]) -> None:
    """The notebook side of datapub: read the latest window per rank, 5 times a second."""
    while not stop.wait(0.2):
        for rank, data in zip(ranks, run.ar.data):
            window = (data or {}).get("ck")
            if window:
                seen.update((rank, s) for s in window["steps"])


def bench_channel(steps: int, window: int, rounds: int, work: float) -> dict:
    from clusterkernel import Cluster, metrics
    from clusterkernel.client.dashboard import MetricsStore, Receiver

    out: dict[str, list[dict]] = {"none": [], "zmq": [], "datapub": []}
    with Cluster(n=4, env={"OMP_NUM_THREADS": "1"}) as cluster:
        ranks = cluster.ranks
        total = steps * len(ranks)
        cluster.run("pass", renderer=Quiet())
        for _ in range(rounds):
            # none
            cluster.run(LOOP.format(steps=steps, work=work), renderer=Quiet())
            loop = cluster.pull("bench_loop_s")
            out["none"].append({"steps_per_s": h.median(steps / t for t in loop.values())})

            # zmq: clusterkernel's stream
            store = MetricsStore()
            rx = Receiver(store).start()
            cluster.view().apply_sync(metrics.stream, rx.address, rx.key, 0.1)
            cluster.run(LOOP.format(steps=steps, work=work), renderer=Quiet())
            live = sum(len(store.series("loss").get(r, ([],))[0]) for r in ranks)
            seqs = cluster.view().apply_sync(metrics.flush_stream, 30)
            store.wait_for(dict(zip(ranks, seqs)), 30)
            final = sum(len(store.series("loss").get(r, ([],))[0]) for r in ranks)
            loop = cluster.pull("bench_loop_s")
            cluster.view().apply_sync(metrics.stop_stream)
            rx.stop()
            out["zmq"].append(
                {
                    "steps_per_s": h.median(steps / t for t in loop.values()),
                    "live": live / total,
                    "final": final / total,
                }
            )

            # datapub: windows of history through ipyparallel's data_message
            seen: set = set()
            stop = threading.Event()
            code = DATAPUB_START.format(window=window) + LOOP.format(steps=steps, work=work)
            code += "time.sleep(0.3)\n" + DATAPUB_STOP  # let the last window go out
            run = cluster.run(code, renderer=Quiet(), block=False)
            reader = threading.Thread(target=_collect_datapub, args=(run, seen, stop, ranks))
            reader.start()
            run.wait()
            live = len(seen)
            time.sleep(1.0)
            stop.set()
            reader.join()
            _collect_datapub_once(run, seen, ranks)
            loop = cluster.pull("bench_loop_s")
            out["datapub"].append(
                {
                    "steps_per_s": h.median(steps / t for t in loop.values()),
                    "live": live / total,
                    "final": len(seen) / total,
                }
            )
    return out


def _collect_datapub_once(run, seen: set, ranks: list[int]) -> None:
    for rank, data in zip(ranks, run.ar.data):
        window = (data or {}).get("ck")
        if window:
            seen.update((rank, s) for s in window["steps"])


def print_channel(res: dict, steps: int, window: int, work: float) -> None:
    what = f"{work * 1e6:.0f} us of work per step" if work else "a tight loop"
    print(f"\nchannel: 4 ranks, {steps} log() calls per rank, {what}; datapub window {window}")
    print(f"{'variant':<9} {'loop steps/s':>13} {'vs none':>8} {'live':>7} {'final':>7}")
    base = h.median(r["steps_per_s"] for r in res["none"])
    for name, runs in res.items():
        sps = h.median(r["steps_per_s"] for r in runs)
        live = h.median(r.get("live", float("nan")) for r in runs)
        final = h.median(r.get("final", float("nan")) for r in runs)
        print(f"{name:<9} {sps:>13.0f} {sps / base:>7.2f}x {live:>7.1%} {final:>7.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000, help="log() calls per rank")
    ap.add_argument(
        "--work-us",
        type=float,
        nargs="+",
        default=[0.0, 200.0],
        help="busy work per logged step, microseconds (one table each)",
    )
    ap.add_argument("--window", type=int, default=5_000, help="records per datapub window")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with h.mpi_lock():
        for work_us in args.work_us:
            steps = args.steps if not work_us else min(args.steps, int(3e6 / work_us))
            res = bench_channel(steps, args.window, args.rounds, work_us * 1e-6)
            print("RESULT channel " + json.dumps({"work_us": work_us, **res}))
            print_channel(res, steps, args.window, work_us * 1e-6)


if __name__ == "__main__":
    main()
