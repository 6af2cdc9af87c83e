"""Benchmark the comm layer against raw mpi4py, torch.distributed (gloo) and memcpy.

Run from the repository root::

    python benchmarks/bench_comm.py            # 2 and 4 ranks, 4 KB .. 64 MB
    python benchmarks/bench_comm.py --ranks 2 --max-bytes 4MB   # quicker

The script measures a single-process memcpy (the physical reference), then starts
itself under ``mpiexec -n 2`` and ``-n 4``. Inside, every method runs in the same
job, interleaved over several rounds; a time is the slowest rank's mean time per
call, and the best round is kept (this machine is shared and noisy; ratios between
methods measured side by side are what matter). Bus bandwidth follows the
nccl-tests convention: ``bytes / time * 2 (n - 1) / n`` for an allreduce.

Compared, all on float32:

- ``comm``: ``comm.all_reduce(tensor)`` (algorithm "mpi"), recording on
- ``mpi4py``: ``MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, ndarray)``
- ``gloo``: ``torch.distributed.all_reduce`` with the gloo backend
- ``ring``: ``comm.all_reduce(tensor, algorithm="ring")``
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KB, MB = 1024, 1024 * 1024
SIZES = [4 * KB, 16 * KB, 64 * KB, 256 * KB, 1 * MB, 4 * MB, 16 * MB, 64 * MB]
ROUNDS = 5
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


def run_job(n: int, sizes: list[int]) -> dict:
    sys.path.insert(0, str(REPO))
    from clusterkernel.mpiexec import MPIRuntime

    rt = MPIRuntime.detect()
    env = rt.env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"  # ranks share the cores
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [*rt.command(n), sys.executable, __file__, "--worker", str(out)]
        cmd += ["--sizes", ",".join(map(str, sizes))]
        subprocess.run(cmd, env=env, check=True, timeout=1800)
        return json.loads(out.read_text())


def report(n: int, res: dict, memcpy: dict[int, float]) -> list[tuple[str, bool, str]]:
    """Print one rank count's tables; return (target, met, detail) rows."""
    print(f"\n=== {n} ranks (Open MPI {res['mpi']}, torch {res['torch']}) ===")
    print("algorithms: mpi4py = MPI Allreduce on numpy; comm = comm.all_reduce(algorithm='mpi');")
    print("            ring = comm.all_reduce(algorithm='ring'); gloo = torch.distributed gloo")
    print(
        f"{'size':>7} | {'memcpy':>9} | {'mpi4py':>9} | {'comm':>9} | {'ring':>9} | {'gloo':>9} |"
        f" {'comm/mpi4py':>11} | {'gloo/comm':>9} | {'ring/comm':>9} | {'busbw comm':>10} |"
        f" {'busbw ring':>10}"
    )
    print(
        f"{'':>7} | {'us':>9} | {'us':>9} | {'us':>9} | {'us':>9} | {'us':>9} |"
        f" {'speed':>11} | {'speed':>9} | {'time':>9} | {'GB/s':>10} | {'GB/s':>10}"
    )
    targets = []
    for row in res["allreduce"]:
        nb = row["bytes"]
        mc, raw, cm, ring, gloo = (memcpy[nb], row["mpi4py"], row["comm"], row["ring"], row["gloo"])
        factor = 2 * (n - 1) / n / 1e9  # bus bandwidth of an allreduce, GB/s
        print(
            f"{_fmt_bytes(nb):>7} | {mc * 1e6:9.1f} | {raw * 1e6:9.1f} | {cm * 1e6:9.1f} |"
            f" {ring * 1e6:9.1f} | {gloo * 1e6:9.1f} | {raw / cm:10.2f}x | {gloo / cm:8.1f}x |"
            f" {ring / cm:8.2f}x | {nb / cm * factor:10.2f} | {nb / ring * factor:10.2f}"
        )
        if nb >= 256 * KB:
            targets.append(
                (
                    f"{n} ranks {_fmt_bytes(nb)}: comm >= 0.95x mpi4py speed",
                    raw / cm >= 0.95,
                    f"{raw / cm:.2f}x",
                )
            )
        if nb == 4 * KB:
            targets.append(
                (f"{n} ranks 4 KB: comm <= 2x mpi4py time", cm / raw <= 2.0, f"{cm / raw:.2f}x")
            )
        if nb == 4 * MB:
            targets.append(
                (f"{n} ranks 4 MB: comm >= 4x gloo speed", gloo / cm >= 4.0, f"{gloo / cm:.1f}x")
            )
            targets.append(
                (
                    f"{n} ranks 4 MB: ring <= 1.5x MPI time",
                    ring / cm <= 1.5,
                    f"{ring / cm:.2f}x (ring/comm-mpi); {ring / raw:.2f}x (ring/mpi4py)",
                )
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
    sizes = [s for s in SIZES if s <= args.max_bytes]
    memcpy = memcpy_times(sizes)
    all_targets = []
    for n in args.ranks:
        res = run_job(n, sizes)
        all_targets += report(n, res, memcpy)
    print("\nTargets:")
    for name, met, detail in all_targets:
        print(f"  [{'met' if met else 'MISSED'}] {name}: {detail}")


# --------------------------------------------------------------------------- worker


def worker(out_path: str, sizes: list[int]) -> None:
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

    def best_of(methods: dict, iters: int) -> dict:
        best = dict.fromkeys(methods, float("inf"))
        for _ in range(ROUNDS):  # interleaved, so noise hits all methods alike
            for name, fn in methods.items():
                best[name] = min(best[name], timed(fn, iters))
        return best

    rows = []
    for nb in sizes:
        # Zeros stay zeros under repeated in-place sums (ones would overflow to inf).
        arr = np.zeros(nb // 4, dtype=np.float32)
        t = torch.zeros(nb // 4)
        tr = torch.zeros(nb // 4)
        tg = torch.zeros(nb // 4)
        methods = {
            "mpi4py": lambda arr=arr: world.Allreduce(MPI.IN_PLACE, arr),
            "comm": lambda t=t: comm.all_reduce(t),
            "ring": lambda tr=tr: comm.all_reduce(tr, algorithm="ring"),
            "gloo": lambda tg=tg: dist.all_reduce(tg),
        }
        row = best_of(methods, _iters(nb))
        row["bytes"] = nb
        rows.append(row)
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
        _handle.note("all_reduce", 4096, "mpi", n, t0, None)
    note_cost = (time.perf_counter() - t0) / 100000
    rec.clear()

    dist.destroy_process_group()
    if rank == 0:
        result = {
            "allreduce": rows,
            "fusion": fusion,
            "recording": {"on": on, "off": off, "note": note_cost},
            "mpi": MPI.Get_library_version().split(",")[0].replace("Open MPI v", ""),
            "torch": torch.__version__,
        }
        Path(out_path).write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--max-bytes", type=_parse_bytes, default=64 * MB)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        sys.path.insert(0, str(REPO))
        worker(args.worker, [int(s) for s in args.sizes.split(",")])
    else:
        parent(args)


if __name__ == "__main__":
    main()
