"""Issue 36: the cost of profiling a cell, as a ratio to the same work unprofiled.

Three ways, each on a tight Python loop and on a small torch training step, rounds
interleaved (``_harness``: paired ratios, medians, the A/A control):

- ``sampler``: clusterkernel's sampler thread (``clusterkernel.rank._profile``,
  ``sys._current_frames()`` at N Hz), what ``%%mpi --profile`` runs on each rank;
- ``pyinstrument``: pyinstrument 5's profiler (its C stat-profile hook at its default
  1 ms interval), when it is importable (``pip install pyinstrument``, or
  ``--pyinstrument-path DIR`` for a ``pip install --target DIR`` copy);
- ``off``: no profiling, twice (the A/A control).

One process, no ranks: the cost is each rank's own. Run from the repository root::

    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_profile.py [--rounds 7] [--hz 100]

Two more parts, on real ranks:

- ``--part show --ranks 4 16``: the time from a profiled cell's end to its profile
  ready to show (every rank's sampler stopped and collected, the HTML with the flame
  graphs and the text built), for a cell of ``--cell-seconds`` of Python work;
- ``--part ddp``: ``bench_torch.py``'s DDP training function (gloo, 2 ranks) in a
  cell with and without ``profile=True`` (and ``profile="torch"``), and inside
  ``cluster.profile("start", every=...)`` (snapshots cut on the ranks and pulled while
  the cell runs; ``--every``, default 0.5 s: several per cell, far more often than
  the minutes a long run would use) with and without the dashboard panel's rolling
  window pulled (every 2 s), samples/s as a ratio to the unprofiled cell, rounds
  interleaved with the A/A control::

    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_profile.py --part show --ranks 4 16
    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_profile.py --part ddp --rounds 5
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _harness as h  # noqa: E402

from clusterkernel.rank import _profile  # noqa: E402


def _loop(n: int = 3_000_000) -> int:
    def f(i: int) -> int:
        return i * 2 + 1

    total = 0
    for i in range(n):
        total += f(i) % 7
    return total


def _torch_step_factory() -> Callable[[], None]:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def steps(n: int = 150) -> None:
        for _ in range(n):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()

    return steps


def _timed(work: Callable[[], object], how: str, hz: float) -> float:
    prof = None
    t0 = time.perf_counter()
    if how == "sampler":
        prof = _profile.Sampler(hz=hz).start()
    elif how == "pyinstrument":
        import pyinstrument

        prof = pyinstrument.Profiler()
        prof.start()
    work()
    if prof is not None:
        prof.stop()
    return time.perf_counter() - t0


_SHOW_CELL = """
import time
from clusterkernel import comm

def parse(line):
    return sum(int(x) for x in line.split(","))

def step(k):
    total = 0
    for i in range(2000):
        total += parse("1,2,3," + str(i % 97))
    if comm.get_rank() == 1:
        time.sleep(0.002)
    return total

t_end = time.perf_counter() + {seconds}
k = 0
while time.perf_counter() < t_end:
    step(k)
    k += 1
"""


def part_show(sizes: list[int], rounds: int, seconds: float) -> None:
    """Cell end -> profile ready to show, at each size: stop + collect, then render."""
    from clusterkernel import Cluster
    from clusterkernel.client.profile import CellProfile

    for n in sizes:
        cluster = Cluster(n=n).start()
        try:
            ranks = cluster.live_ranks
            code = _SHOW_CELL.format(seconds=seconds)
            cluster.view(ranks).execute("from clusterkernel import comm", block=True)
            collect, render, size = [], [], 0
            for _ in range(rounds):
                cp = CellProfile(cluster, ranks)
                cluster.view(ranks).execute(code, block=True)  # the cell, to its end
                t0 = time.perf_counter()
                prof = cp.finish(show=False)
                t1 = time.perf_counter()
                page = prof._repr_html_()
                str(prof)
                t2 = time.perf_counter()
                assert not prof.missing, prof.missing
                collect.append(t1 - t0)
                render.append(t2 - t1)
                size = len(page)
            total = [a + b for a, b in zip(collect, render)]
            print(
                f"| {n} | {seconds:g} s | {h.median(collect) * 1e3:.0f} ms | "
                f"{h.median(render) * 1e3:.0f} ms | **{h.median(total) * 1e3:.0f} ms** "
                f"[{h.span([t * 1e3 for t in total], '.0f')} ms, {rounds} cells] | {size / 1e3:.0f} kB |",
                flush=True,
            )
        finally:
            cluster.stop()


def part_ddp(rounds: int, n: int = 2, steps: int = 200, every: float = 0.5) -> None:
    """bench_torch.py's DDP training cell: samples/s with profiling on / off."""
    import contextlib
    import io
    import threading

    import bench_torch

    from clusterkernel import Cluster
    from clusterkernel.client.profile import current

    cluster = Cluster(n=n, torch=True, env={"OMP_NUM_THREADS": "1"}).start()
    try:
        cluster.run(bench_torch._TRAIN)
        cluster.run("rate = train(steps=20)")  # warm

        def rate(profile) -> float:
            with contextlib.redirect_stdout(io.StringIO()):  # the profile's tables
                cluster.run(f"rate = train(steps={steps})", profile=profile)
            return cluster.pull("rate")[0]

        def rate_every(panel: bool) -> float:
            """Inside profile start/stop with ``every``; ``panel``: as a dashboard's
            profile panel on show asks (LiveProfile.want, every 2 s: its rolling window)."""
            cluster.profile("start", every=every)
            stop = threading.Event()

            def ask() -> None:
                while not stop.wait(1.0):
                    current(cluster).want()

            asker = threading.Thread(target=ask, daemon=True)
            if panel:
                current(cluster).want()
                asker.start()
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    cluster.run(f"rate = train(steps={steps})")
            finally:
                stop.set()
                if panel:
                    asker.join()
                p = cluster.profile("stop", show=False)
            counts.append(len(p.snapshots))
            return cluster.pull("rate")[0]

        counts: list[int] = []
        ways = {
            "off": lambda: rate(False),
            "off again": lambda: rate(False),
            "--profile": lambda: rate(True),
            "--profile torch": lambda: rate("torch"),
            f"every {every:g}s": lambda: rate_every(False),
            f"every {every:g}s + panel": lambda: rate_every(True),
        }
        got = h.interleaved(ways, rounds)
        print(f"\nDDP gloo, {n} ranks, {steps} steps: off {h.median(got['off']):.0f} samples/s")
        print(f"snapshots per cell with every {every:g}s: {sorted(counts)}")
        aa = h.paired(got["off again"], got["off"])
        for way in list(ways)[1:]:
            # a rate: the cost is off / way (>1 means slower with profiling)
            cost = h.paired(got["off"], got[way])
            print(f"  {way:<16} cost {h.fmt_ratio(cost, 3)}  (A/A {h.fmt_ratio(aa, 3)})")
    finally:
        cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("cost", "show", "ddp"), default="cost")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--hz", type=float, default=_profile.DEFAULT_HZ)
    ap.add_argument("--pyinstrument-path", help="a directory holding pyinstrument")
    ap.add_argument("--ranks", type=int, nargs="+", default=[4], help="show part: sizes")
    ap.add_argument("--cell-seconds", type=float, default=3.0, help="show part: cell length")
    ap.add_argument("--every", type=float, default=0.5, help="ddp part: seconds per snapshot")
    args = ap.parse_args()
    if args.part == "show":
        with h.mpi_lock():
            print("| ranks | cell | stop + collect | render (HTML + text) | to show | HTML |")
            print("|---|---|---|---|---|---|")
            part_show(args.ranks, args.rounds, args.cell_seconds)
        return
    if args.part == "ddp":
        with h.mpi_lock():
            part_ddp(args.rounds, every=args.every)
        return
    if args.pyinstrument_path:
        sys.path.insert(0, args.pyinstrument_path)
    variants = ["off", "off again", "sampler"]
    try:
        import pyinstrument

        variants.append("pyinstrument")
        print(f"pyinstrument {pyinstrument.__version__}")
    except ImportError:
        print("pyinstrument not importable: left out")
    loads = {"python loop": _loop, "torch step": _torch_step_factory()}
    with h.mpi_lock():
        for load, work in loads.items():
            work()  # warm
            ways = {
                v: (lambda v=v, work=work: _timed(work, v.removesuffix(" again"), args.hz))
                for v in variants
            }
            times = h.interleaved(ways, args.rounds)
            base = h.median(times["off"])
            print(f"\n{load}: off {base * 1e3:.0f} ms (median of {args.rounds}), hz={args.hz:g}")
            aa = h.paired(times["off again"], times["off"])
            for v in variants[1:]:
                ratio = h.paired(times[v], times["off"])
                print(f"  {v:<13} {h.fmt_ratio(ratio, 3)}  within noise: {h.aa_verdict(ratio, aa)}")


if __name__ == "__main__":
    main()
