"""Benchmark the comm layer against raw mpi4py, torch.distributed (gloo) and memcpy.

Run from the repository root::

    python benchmarks/bench_comm.py            # 2 and 4 ranks, 4 KB .. 64 MB
    python benchmarks/bench_comm.py --ranks 2 4 8 --max-bytes 256MB   # the floor's table
    python benchmarks/bench_comm.py --ranks 2 --max-bytes 4MB   # quicker
    python benchmarks/bench_comm.py --ranks 4 --sizes 256KB,1MB --skip gloo   # quicker still

The script measures a single-process memcpy (the physical reference), then starts
itself under ``mpiexec -n 2`` and ``-n 4``. Inside, every method runs in the same
job, interleaved over several rounds; a time is the slowest rank's mean time per
call; tables show the best round (this machine is shared and noisy; ratios between
methods measured side by side are what matter). auto is judged against the best
method on paired rounds: the median over rounds of auto's time / that method's
time in the same round, with the middle half of those ratios (the spread of two
runs of the same code is several percent here, and auto runs one of the others). Bus bandwidth follows the
nccl-tests convention: ``bytes / time * 2 (n - 1) / n`` for an allreduce.

Compared, all on float32, allreduce SUM in place:

- ``mpi4py``: ``MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, ndarray)``
- ``mpi`` / ``ring`` / ``shm``: ``comm.all_reduce(tensor, algorithm=...)``
- ``auto``: ``comm.all_reduce(tensor)``, the default, which adapts from 512 KB (its
  pick is printed: the algorithm and why, ``table``, ``probe`` or ``switch``)
- ``fixed``: ``comm.all_reduce(tensor)`` on a group of the same ranks that keeps the
  table's choice (``CLUSTERKERNEL_AUTO_ADAPT=0`` at its set-up): auto / fixed is what
  adapting gains or costs
- ``auto_zc``: the same on a tensor from ``comm.shm_empty`` (in shared memory: from
  1 MB auto reduces it in place, with no copy in or out)
- ``gloo``: ``torch.distributed.all_reduce`` with the gloo backend
- ``floor``: the data movement alone, every rank at once with no synchronization:
  copy the input into this rank's slot of a shared window, reduce this rank's
  share across all slots, copy the whole result out (issue 13's memory floor)
- fusion: ``comm.all_reduce_coalesced`` of 100 tensors of 1 KB against 100 raw
  mpi4py calls and against a plain flatten / one Allreduce / unflatten
- recording: ``comm.all_reduce`` at 4 KB with metrics on and off
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from _harness import median, mpi_lock, paired  # noqa: E402

KB, MB = 1024, 1024 * 1024
SIZES = [4 * KB, 16 * KB, 64 * KB, 256 * KB, 1 * MB, 4 * MB, 16 * MB, 64 * MB, 256 * MB]
ROUNDS = 7
BYTES_PER_MEASUREMENT = 256 * MB  # iterations shrink as messages grow


def _iters(nbytes: int) -> int:
    return max(5, min(2000, BYTES_PER_MEASUREMENT // nbytes))


def _fmt_bytes(n: int) -> str:
    return f"{n // MB} MB" if n >= MB else f"{n // KB} KB"


def time_calls(world, fn, iters: int) -> float:
    """Seconds per call of ``fn`` on the slowest rank (after a short warm-up)."""
    from mpi4py import MPI

    for _ in range(min(3, iters)):
        fn()
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return world.allreduce(time.perf_counter() - t0, op=MPI.MAX) / iters


def _parse_bytes(text: str) -> int:
    text = text.strip().upper()
    for unit, mult in (("MB", MB), ("KB", KB), ("B", 1)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * mult)
    return int(text)


# --------------------------------------------------------------------------- parent


def memcpy_times(sizes: list[int]) -> dict[int, float]:
    """Seconds per copy of ``n`` bytes in one process (numpy copyto)."""
    import numpy as np

    out = {}
    for n in sizes:
        src = np.ones(n // 4, dtype=np.float32)
        dst = np.empty_like(src)
        iters = _iters(n)
        np.copyto(dst, src)
        best = float("inf")
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            for _ in range(iters):
                np.copyto(dst, src)
            best = min(best, (time.perf_counter() - t0) / iters)
        out[n] = best
    return out


def mpi_launch():
    """The MPI runtime and the environment for workers started under its mpiexec
    (this checkout importable, one OpenMP thread per process: ranks share the cores)."""
    sys.path.insert(0, str(REPO))
    from clusterkernel.client.mpiexec import MPIRuntime

    rt = MPIRuntime.detect()
    env = rt.env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    return rt, env


def run_job(
    n: int,
    sizes: list[int],
    script: str = __file__,
    skip: Sequence[str] = (),
    rounds: int | None = None,
) -> dict:
    """Run ``script --worker OUT --sizes ...`` on ``n`` ranks; the JSON it wrote to OUT
    (``skip``: methods left out, ``rounds``: interleaved rounds; bench_comm's worker only)."""
    rt, env = mpi_launch()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [*rt.command(n), sys.executable, script, "--worker", str(out)]
        cmd += ["--sizes", ",".join(map(str, sizes))]
        if skip:
            cmd += ["--skip", ",".join(skip)]
        if rounds:
            cmd += ["--rounds", str(rounds)]
        subprocess.run(cmd, env=env, check=True, timeout=1800)
        return json.loads(out.read_text())


METHODS = ("mpi4py", "mpi", "ring", "shm", "auto", "fixed", "gloo", "auto_zc")


def _ratio_line(cells: list[str]) -> str:
    return " | ".join(cells)


def report(n: int, res: dict, memcpy: dict[int, float]) -> list[tuple[str, bool, str]]:
    """Print one rank count's tables; return (target, met, detail) rows."""
    m = res["machine"]
    print(f"\n=== {n} ranks (Open MPI {res['mpi']}, torch {res['torch']}) ===")
    lat = f"{m['latency'] * 1e6:.2f} us" if m["latency"] else "-"
    r = {k: v / 1e9 for k, v in m["rates"].items()}
    print(
        f"memory, bytes read + written: one rank streams {m['bw_one'] / 1e9:.1f} GB/s (copy "
        f"{r['copy_one']:.1f}, in-place sum {r['sum_one']:.1f}), all {n} at once "
        f"{m['bw_all'] / 1e9:.1f} GB/s together (copy {r['copy_all']:.1f}, sum "
        f"{r['sum_all']:.1f}); MPI 8 B one-way {lat}"
    )
    print("time per allreduce, us (slowest rank, best round); pick = what auto ran last;")
    print("best = the fastest of mpi4py and comm's mpi, ring, shm and gloo (median round);")
    print("auto/best = median of the per-round ratio [middle half]; bwfloor = the least")
    print("time the memory allows (bandwidth_floor); busbw = nccl-tests' bus bandwidth")
    methods = [m_ for m_ in METHODS if m_ in res["allreduce"][0]]  # those not skipped
    head = ["size", "memcpy", "floor", "bwfloor", *methods, "pick", "auto/best"]
    head += ["auto/fixed", "mpi4py/auto", "auto/bwfloor", "mpi4py/bwfl", "busbw GB/s"]
    print(_ratio_line([f"{h:>11}" for h in head]))
    targets = []
    for row in res["allreduce"]:
        nb = row["bytes"]
        auto, raw, floor = row["auto"], row["mpi4py"], row["floor"]
        bw_floor = bandwidth_floor(nb, n, m)
        rounds = row["rounds"]
        others = [m_ for m_ in methods if m_ not in ("auto", "auto_zc", "fixed")]
        best_name = min(others, key=lambda m_: median(rounds[m_]))
        ratio, q1, q3 = paired(rounds["auto"], rounds[best_name])
        busbw = nb / auto * 2 * (n - 1) / n / 1e9 if n > 1 else 0.0
        cells = [_fmt_bytes(nb), f"{memcpy[nb] * 1e6:.1f}", f"{floor * 1e6:.1f}"]
        cells += [f"{bw_floor * 1e6:.1f}"]
        cells += [f"{row[m_] * 1e6:.1f}" for m_ in methods]
        cells += [row["pick"], f"{ratio:.2f}x [{q1:.2f}-{q3:.2f}] vs {best_name}"]
        fx, f1, f3 = paired(rounds["auto"], rounds.get("fixed", []))  # NaN when skipped
        cells += [f"{fx:.2f}x [{f1:.2f}-{f3:.2f}]"]
        cells += [f"{raw / auto:.2f}x", f"{auto / bw_floor:.2f}x", f"{raw / bw_floor:.2f}x"]
        cells += [f"{busbw:.1f}"]
        print(_ratio_line([f"{c:>11}" for c in cells]))
        size = _fmt_bytes(nb)
        targets.append(
            (
                f"{n} ranks {size}: auto >= 0.9x the best of comm's algorithms and mpi4py",
                ratio <= 1 / 0.9,
                f"auto ({row['pick']}) / {best_name}: median {ratio:.3f}x over paired rounds, "
                f"middle half {q1:.3f}-{q3:.3f}",
            )
        )
        if nb <= 64 * KB:  # small calls: adapting (from 512 KB) must cost them nothing
            targets.append(
                (
                    f"{n} ranks {size}: auto <= 1.15x mpi4py time",
                    auto / raw <= 1.15,
                    f"{auto / raw:.2f}x (best rounds), median of rounds "
                    f"{paired(rounds['auto'], rounds['mpi4py'])[0]:.2f}x",
                )
            )
        if nb == 64 * MB:
            targets.append(
                (
                    f"{n} ranks 64 MB: auto within 1.3x of the memory's floor",
                    auto / bw_floor <= 1.3,
                    f"{auto / bw_floor:.2f}x the bandwidth floor, {auto / floor:.2f}x the "
                    "shared-buffer data movement's",
                )
            )
        if nb == 64 * MB and "auto_zc" in row:
            targets.append(
                (
                    f"{n} ranks 64 MB: auto >= 2x mpi4py speed",
                    raw / auto >= 2.0,
                    f"{raw / auto:.2f}x (on a shm_empty tensor: {raw / row['auto_zc']:.2f}x)",
                )
            )
        if nb == 4 * MB and "gloo" in row:
            gloo = row["gloo"]
            targets.append(
                (
                    f"{n} ranks 4 MB: auto >= 4x gloo speed",
                    gloo / auto >= 4.0,
                    f"{gloo / auto:.1f}x",
                )
            )
    for row in res["allreduce"]:
        arm = row.get("arm")
        if arm:  # what the group's last probe rounds agreed (the slowest rank's medians)
            agreed = ", ".join(f"{a} {t * 1e6:.1f}" for a, t in sorted(arm["seconds"].items()))
            print(
                f"auto's arm at {_fmt_bytes(row['bytes'])}: {arm['calls']} calls, agreed us: {agreed}"
            )
    fu = res["fusion"]
    print(
        f"\n100 x 1 KB allreduce: 100 raw mpi4py calls {fu['raw'] * 1e6:.0f} us | "
        f"flatten+Allreduce+unflatten {fu['flat'] * 1e6:.0f} us ({fu['raw'] / fu['flat']:.1f}x) | "
        f"comm.all_reduce_coalesced {fu['coalesced'] * 1e6:.0f} us ({fu['raw'] / fu['coalesced']:.1f}x)"
    )
    if n == 4:
        targets.append(
            (
                "4 ranks: coalesced >= 2x faster than 100 raw calls",
                fu["raw"] / fu["coalesced"] >= 2.0,
                f"{fu['raw'] / fu['coalesced']:.1f}x (plain flatten: {fu['raw'] / fu['flat']:.1f}x)",
            )
        )
    rc = res["recording"]
    print(
        f"recording: 4 KB comm.all_reduce {rc['on'] * 1e6:.2f} us with metrics on, "
        f"{rc['off'] * 1e6:.2f} us off; one record costs {rc['note'] * 1e9:.0f} ns "
        f"= {rc['note'] / rc['on'] * 100:.1f}% of the call"
    )
    return targets


def parent(args: argparse.Namespace) -> None:
    sizes = args.sizes or [s for s in SIZES if s <= args.max_bytes]
    memcpy = memcpy_times(sizes)
    all_targets = []
    for n in args.ranks:
        res = run_job(n, sizes, skip=args.skip, rounds=args.rounds)
        all_targets += report(n, res, memcpy)
    print("\nTargets:")
    for name, met, detail in all_targets:
        print(f"  [{'met' if met else 'MISSED'}] {name}: {detail}")


# --------------------------------------------------------------------------- worker


def memory_floor(world, count: int):
    """Issue 13's memory floor for an allreduce of ``count`` float32 on one node.

    Returns ``(fn, free)``: ``fn`` is the data movement of a shared-memory allreduce
    alone, every rank at once and with no synchronization (so its result is not a
    sum): copy the input into this rank's slot of an MPI shared window, reduce this
    rank's share across all slots into slot 0, copy the whole of slot 0 out. No
    algorithm that moves the data through shared memory this way can be faster.
    ``free`` releases the window (collective).
    """
    import torch
    from mpi4py import MPI

    rank, n = world.Get_rank(), world.Get_size()
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    win = MPI.Win.Allocate_shared(count * 4, 4, comm=node)
    slots = []
    for r in range(node.Get_size()):
        buf, _ = win.Shared_query(r)
        slots.append(torch.frombuffer(buf, dtype=torch.float32, count=count))
    t = torch.zeros(count)
    a, b = count * rank // n, count * (rank + 1) // n

    def fn() -> None:
        slots[rank].copy_(t)
        acc = slots[0][a:b]
        for j in range(1, n):
            acc.add_(slots[j][a:b])
        t.copy_(slots[0])

    def free() -> None:
        slots.clear()
        win.Free()
        node.Free()

    return fn, free


def machine(world, nbytes: int = 256 * MB) -> dict:
    """What the memory gives a rank here: the rate it streams memory (bytes read plus
    bytes written per second) alone and with every rank at once (each its share of
    the node's), and MPI's one-way latency for 8 bytes between ranks 0 and 1 (half a
    ping-pong: an upper bound on the cache-to-cache latency, MPI's own costs included).

    The rate is the faster of two ways to stream: a plain copy (glibc's, non-temporal
    stores at this size) and an in-place sum of two arrays (read two, write one: a
    reduction's own pattern). On the 2-core machine the sum streams 1.4-1.6x the
    copy's bytes per second, and an all_reduce in place (``auto_zc``) ran faster than
    a floor taken from the copy alone (BENCHMARKS.md, "Collectives", "The adapting
    default at 8 ranks, and the floor measured again"). With more ranks than cores,
    "at once" shares the cores among the ranks: the cores' combined rate, which is
    what moves all the ranks' bytes."""
    import numpy as np
    import torch
    from mpi4py import MPI

    rank, n = world.Get_rank(), world.Get_size()
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # pages touched
    into, other = torch.from_numpy(dst), torch.from_numpy(src)
    ways = {  # name: (one pass, bytes read + written per byte of the array)
        "copy": (lambda: np.copyto(dst, src), 2),
        "sum": (lambda: into.add_(other), 3),
    }

    def best_time(fn, me: bool) -> float:
        best = float("inf")
        for _ in range(5):
            world.Barrier()
            t0 = time.perf_counter()
            if me:
                fn()
            best = min(best, time.perf_counter() - t0)
        return best

    rates = {}
    for name, (fn, k) in ways.items():
        rates[f"{name}_one"] = k * nbytes / world.bcast(best_time(fn, rank == 0), root=0)
        slowest = world.allreduce(best_time(fn, True), op=MPI.MAX)
        rates[f"{name}_all"] = n * k * nbytes / slowest
    latency = None
    if n > 1:
        buf = np.zeros(1)
        reps = 2000
        world.Barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            if rank == 0:
                world.Send(buf, 1)
                world.Recv(buf, 1)
            elif rank == 1:
                world.Recv(buf, 0)
                world.Send(buf, 0)
        latency = (time.perf_counter() - t0) / reps / 2
        latency = world.bcast(latency, root=0)
    return {
        "bw_one": max(rates[f"{w}_one"] for w in ways),
        "bw_all": max(rates[f"{w}_all"] for w in ways),
        "rates": rates,
        "latency": latency,
    }


def bandwidth_floor(nbytes: int, n: int, m: dict) -> float:
    """The least time an allreduce of ``nbytes`` on ``n`` ranks of one node can take:
    every rank reads its input and writes its result once (2 x nbytes at one rank's
    rate), and the node moves that for all ranks at once (2 n x nbytes at all ranks'
    rate), each rate the faster way to stream (:func:`machine`). Algorithms that copy
    through a shared buffer move more than this; one in place (``auto_zc``) does not."""
    return max(2 * nbytes / m["bw_one"], 2 * n * nbytes / m["bw_all"])


def _fixed_group(comm):
    """Every rank, as a group whose ``auto`` keeps the table's choice (collective)."""
    g = comm.new_group(list(range(comm.size())))
    was = os.environ.get("CLUSTERKERNEL_AUTO_ADAPT")
    os.environ["CLUSTERKERNEL_AUTO_ADAPT"] = "0"
    try:
        comm.auto_choice("all_reduce", 0, g)  # its rules are made now: no adapting
    finally:
        if was is None:
            del os.environ["CLUSTERKERNEL_AUTO_ADAPT"]
        else:
            os.environ["CLUSTERKERNEL_AUTO_ADAPT"] = was
    return g


def worker(out_path: str, sizes: list[int], skip: Sequence[str] = ()) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from clusterkernel import comm, metrics
    from clusterkernel.comm import _handle

    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()

    port = None
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = world.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)

    def timed(fn, iters: int) -> float:
        return time_calls(world, fn, iters)

    def rounds_of(methods: dict, iters: int) -> dict:
        times: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(ROUNDS):  # interleaved, so noise hits all methods alike
            for name, fn in methods.items():
                times[name].append(timed(fn, iters))
        return times

    def best_of(methods: dict, iters: int) -> dict:
        return {name: min(ts) for name, ts in rounds_of(methods, iters).items()}

    bandwidths = machine(world)
    fixed_group = _fixed_group(comm)
    rows = []
    for nb in sizes:
        # Zeros stay zeros under repeated in-place sums (ones would overflow to inf).
        count = nb // 4
        arr = np.zeros(count, dtype=np.float32)
        # One tensor for every method on ordinary memory: where a buffer lands (its
        # alignment, its pages) moved one method against another by up to 15% at
        # 16-64 KB, with the same code on both.
        shared = torch.zeros(count)
        ts = dict.fromkeys(("mpi", "ring", "shm", "auto", "fixed", "gloo"), shared)
        ts["auto_zc"] = comm.shm_empty(count).zero_()  # lives until exit: one per size
        floor, free_floor = memory_floor(world, count)
        methods = {
            "mpi4py": lambda arr=arr: world.Allreduce(MPI.IN_PLACE, arr),
            "mpi": lambda t=ts["mpi"]: comm.all_reduce(t, algorithm="mpi"),
            "ring": lambda t=ts["ring"]: comm.all_reduce(t, algorithm="ring"),
            "shm": lambda t=ts["shm"]: comm.all_reduce(t, algorithm="shm"),
            "auto": lambda t=ts["auto"]: comm.all_reduce(t),
            "fixed": lambda t=ts["fixed"]: comm.all_reduce(t, group=fixed_group),
            "auto_zc": lambda t=ts["auto_zc"]: comm.all_reduce(t),
            "gloo": lambda t=ts["gloo"]: dist.all_reduce(t),
            "floor": floor,
        }
        for name in skip:
            del methods[name]
        times = rounds_of(methods, _iters(nb))
        row = {name: min(ts) for name, ts in times.items()}
        row["rounds"] = times
        row["bytes"] = nb
        # what auto runs now: its arm's choice where the size adapts (why: table, probe,
        # switch), else the table's
        from clusterkernel.comm._auto.adapt import size_class

        arm = comm.auto_state().get(("all_reduce", size_class(nb)))
        row["pick"] = (
            f"{arm['algorithm']} ({arm['why']})" if arm else comm.auto_choice("all_reduce", nb)
        )
        row["arm"] = arm and {k: arm[k] for k in ("calls", "seconds")}
        rows.append(row)
        free_floor()
        metrics.recorder().clear()  # keep memory flat across sizes

    # Fusion: 100 tensors of 1 KB.
    arrays = [np.zeros(256, dtype=np.float32) for _ in range(100)]
    tensors = [torch.zeros(256) for _ in range(100)]
    flat_ts = [torch.zeros(256) for _ in range(100)]

    def raw_100():
        for a in arrays:
            world.Allreduce(MPI.IN_PLACE, a)

    def flatten_once():
        flat = torch.cat([x.view(-1) for x in flat_ts])
        world.Allreduce(MPI.IN_PLACE, flat.numpy())
        for x, y in zip(flat_ts, flat.split([x.numel() for x in flat_ts])):
            x.copy_(y)

    fusion = best_of(
        {
            "raw": raw_100,
            "flat": flatten_once,
            "coalesced": lambda: comm.all_reduce_coalesced(tensors),
        },
        200,
    )

    # Cost of the timing record: the call with recording on and off, and the
    # record alone (the same function the comm layer calls).
    small = torch.zeros(1024)
    on = best_of({"on": lambda: comm.all_reduce(small)}, 2000)["on"]
    metrics.enable(False)
    off = best_of({"off": lambda: comm.all_reduce(small)}, 2000)["off"]
    metrics.enable(True)
    rec = metrics.recorder()
    t0 = time.perf_counter()
    for _ in range(100000):
        _handle.note(("all_reduce", 4096, "mpi", n, None, True), t0, None)
    note_cost = (time.perf_counter() - t0) / 100000
    rec.clear()

    dist.destroy_process_group()
    if rank == 0:
        result = {
            "allreduce": rows,
            "fusion": fusion,
            "recording": {"on": on, "off": off, "note": note_cost},
            "machine": bandwidths,
            "mpi": MPI.Get_library_version().split(",")[0].replace("Open MPI v", ""),
            "torch": torch.__version__,
        }
        Path(out_path).write_text(json.dumps(result))


def main() -> None:
    global ROUNDS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--max-bytes", type=_parse_bytes, default=64 * MB)
    ap.add_argument(
        "--sizes",
        type=lambda text: [_parse_bytes(x) for x in text.split(",")],
        help="these sizes only, e.g. 256KB,1MB (instead of 4 KB .. --max-bytes)",
    )
    ap.add_argument(
        "--skip",
        type=lambda text: text.split(","),
        default=[],
        help=f"methods left out, e.g. gloo (its calls take the longest); of {', '.join(METHODS)}",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        help=f"interleaved rounds per size (default {ROUNDS}; fewer for a quick run)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    unknown = set(args.skip) - set(METHODS) or set(args.skip) & {"mpi4py", "auto"}
    if unknown:
        ap.error(
            f"--skip: cannot leave out {sorted(unknown)}; choose from {METHODS[1:4] + METHODS[5:]}"
        )
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    ROUNDS = args.rounds  # the parent's memcpy reference and the worker's rounds alike
    if args.worker:
        sys.path.insert(0, str(REPO))
        worker(args.worker, args.sizes, args.skip)
    else:
        with mpi_lock():
            parent(args)


if __name__ == "__main__":
    main()
