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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--hz", type=float, default=_profile.DEFAULT_HZ)
    ap.add_argument("--pyinstrument-path", help="a directory holding pyinstrument")
    args = ap.parse_args()
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
