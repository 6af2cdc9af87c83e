"""The first cell after start: how soon the ranks are usable, %%mpi beside raw %%px.

Run: python benchmarks/bench_first_cell.py [--rounds 5] [-n 4]

Each measurement is a fresh Python process (a fresh notebook: nothing imported yet),
three ways, interleaved, the order turned every round:

- ``ck``: ``%load_ext clusterkernel``, ``%mpi start -n N``, then the same cell twice
  with ``%%mpi``, in a real IPython shell, as a user types them; the ranks import what
  a first cell needs while they start (``clusterkernel/rank/_warm_start.py``);
- ``ck-cold``: the same with that warm start turned off (``CLUSTERKERNEL_PREIMPORT=""``
  in the ranks' environment): the first cell imports everything itself;
- ``px``: raw ipyparallel in a process that never imports clusterkernel:
  ``ipyparallel.Cluster(engines="mpi", n=N).start_and_connect_sync()``,
  ``wait_for_engines(N)``, ``%%px`` (blocking) with the same cell twice.

The cell is a print and ``from clusterkernel import comm`` (the quick start's first
line). Reported per way, medians of the rounds: load_ext (ck only), start, the first
cell, the second cell, and **to first result**: from the process's first magic (or
``ipyparallel.Cluster``) to the first cell's result.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

CELL = "print('hello from a rank')\nfrom clusterkernel import comm"
WAYS = ("ck", "ck-cold", "px")


def _shell():
    from IPython.core.interactiveshell import InteractiveShell

    return InteractiveShell.instance()


def _cells(run_cell) -> dict[str, float]:
    t0 = time.perf_counter()
    run_cell()
    t1 = time.perf_counter()
    run_cell()
    return {"first": t1 - t0, "second": time.perf_counter() - t1}


def one_ck(n: int, cold: bool) -> dict[str, float]:
    """One fresh process's ``%load_ext``, ``%mpi start`` and two ``%%mpi`` cells."""
    t0 = time.perf_counter()
    shell = _shell()
    shell.run_line_magic("load_ext", "clusterkernel")
    if cold:  # the ranks' environment without the warm start, as env={...: ""} gives it
        from clusterkernel.client.cluster import _torch
        from clusterkernel.protocol._names import PREIMPORT

        warm_env = _torch.engine_env
        _torch.engine_env = lambda env, group=False: warm_env({PREIMPORT: "", **env}, group)
    t1 = time.perf_counter()
    shell.run_line_magic("mpi", f"start -n {n}")
    t2 = time.perf_counter()
    cells = _cells(lambda: shell.run_cell_magic("mpi", "", CELL))
    shell.run_line_magic("mpi", "stop")
    return {"load_ext": t1 - t0, "start": t2 - t1, **cells, "to_first": t2 - t0 + cells["first"]}


def one_px(n: int) -> dict[str, float]:
    """One fresh process's raw ipyparallel cluster and two ``%%px`` cells."""
    import ipyparallel as ipp

    t0 = time.perf_counter()
    shell = _shell()
    cluster = ipp.Cluster(engines="mpi", n=n, log_level=40)
    client = cluster.start_and_connect_sync()
    client.wait_for_engines(n)
    t1 = time.perf_counter()
    view = client[:]
    view.block = True  # %%px waits for the cell, as %%mpi does
    view.activate()
    cells = _cells(lambda: shell.run_cell_magic("px", "", CELL))
    assert "clusterkernel" not in sys.modules, "the raw side imported clusterkernel"
    cluster.stop_cluster_sync()
    return {"start": t1 - t0, **cells, "to_first": t1 - t0 + cells["first"]}


def measure(way: str, n: int, env: dict[str, str]) -> dict[str, float]:
    """Run one way in a fresh process; its times."""
    out = subprocess.run(
        [sys.executable, __file__, "--one", way, "-n", str(n)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if out.returncode != 0:
        raise SystemExit(f"{way} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _raw_env() -> dict[str, str]:
    """What a user of raw ipyparallel must set by hand here (root, 2 cores < 4 ranks),
    read once in a helper process so that this one never imports clusterkernel."""
    code = (
        "import json; from clusterkernel.client.mpiexec import MPIRuntime as R; "
        "r = R.detect(); print(json.dumps({**r.env({}), 'PATH': r.env()['PATH']}))"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {**os.environ, **json.loads(got.stdout)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--one", choices=WAYS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        got = one_px(args.n) if args.one == "px" else one_ck(args.n, args.one == "ck-cold")
        sys.stdout.flush()
        print(json.dumps(got))
        return
    env = _raw_env()
    with h.mpi_lock():
        ways = {
            w: (lambda w=w: measure(w, args.n, env if w == "px" else dict(os.environ)))
            for w in WAYS
        }
        runs = h.interleaved(ways, args.rounds)
    print(
        f"first cell after start, {args.n} ranks, {args.rounds} rounds interleaved, medians [range]:"
    )
    print(f"  cell: {CELL!r}")
    keys = ("load_ext", "start", "first", "second", "to_first")
    print(f"  {'way':8s}" + "".join(f"{k:>22s}" for k in keys))
    for w in WAYS:
        row = f"  {w:8s}"
        for k in keys:
            xs = [r[k] for r in runs[w] if k in r]
            row += (
                f"{h.median(xs):8.2f} [{min(xs):.2f}-{max(xs):.2f}]".rjust(22) if xs else " " * 22
            )
        print(row)
    for w in ("ck-cold", "px"):
        ratio = h.paired([r["to_first"] for r in runs["ck"]], [r["to_first"] for r in runs[w]])
        print(f"  to first result, ck / {w}: {h.fmt_ratio(ratio)}")


if __name__ == "__main__":
    main()
