"""Hierarchical allreduce (``algorithm="hier"``) across two hosts, beside flat MPI and the ring.

Run from the repository root, as root (under the MPI lock, on a quiet machine)::

    python benchmarks/bench_hier.py                      # 4 KB .. 64 MB
    python benchmarks/bench_hier.py --sizes 4MB --rounds 3
    python benchmarks/bench_hier.py --modes yield --link-rate none,10gbit,1gbit

The second host is a network namespace joined to this machine by a veth pair
(``tests/_netns.py``, the multi-host tests' stand-in for a second machine; ranks
on different hosts talk TCP over the link, ranks on one host shared memory).
Starts itself under ``mpiexec`` with 2 ranks on each host. Inside one job every
method runs interleaved over several rounds; a time is the slowest rank's mean per
call, the best round is kept. float32 SUM, in place, OMP_NUM_THREADS=1.

- ``mpi4py``: ``MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, ndarray)``
- ``mpi`` (flat) / ``hier`` / ``ring``: ``comm.all_reduce(t, algorithm=...)``

Runs twice: with Open MPI's defaults and with ``mpi_yield_when_idle=1`` (the 4
ranks share 2 cores; see ``MODES``). ``hier/flat`` is flat MPI's time over hier's (above 1: hier is faster). Also
prints, per method, the bytes one call moved over the link (rank 0 reads this
host's end of it), as a multiple of the tensor's size.

The veth link runs at memory speed, faster than a real cluster's network.
``--link-rate`` caps it in both directions with tc's token bucket (tbf), one job
per rate (``none``: uncapped), to model an inter-node link slower than memory.
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

import _harness as h
from bench_comm import _fmt_bytes, _iters, _parse_bytes, time_calls  # one size/iteration policy

REPO = Path(__file__).resolve().parents[1]
METHODS = ("mpi4py", "mpi", "hier", "ring")
MEASURE_SECONDS = 0.5
# The 4 ranks share this machine's 2 cores. By default Open MPI busy-polls while it
# waits, which starves the rank being waited for; "yield" makes a waiting rank
# give up its core (mpi_yield_when_idle), as an oversubscribed job should.
MODES = {"default": {}, "yield": {"OMPI_MCA_mpi_yield_when_idle": "1"}}


def run_job(
    sizes: list[int], rounds: int, extra_env: dict[str, str], link_rate: str | None = None
) -> list[dict]:
    sys.path.insert(0, str(REPO))
    from clusterkernel.client.mpiexec import MPIRuntime
    from tests._netns import second_host, ssh_agent, two_host_env

    rt = MPIRuntime.detect()
    with second_host(link_rate) as host, tempfile.TemporaryDirectory() as tmp:
        hosts = [(socket.gethostname(), 2), (host.ns_ip, 2)]
        env = rt.env(hosts=hosts)
        env.update(two_host_env(host, ssh_agent(Path(tmp) / "ssh", host)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["OMP_NUM_THREADS"] = "1"
        env["HIER_LINK_STATS"] = f"/sys/class/net/{host.veth}/statistics"
        env.update(extra_env)
        out = Path(tmp) / "result.json"
        cmd = [*rt.command(4, hosts=hosts), sys.executable, __file__, "--worker", str(out)]
        cmd += ["--sizes", ",".join(map(str, sizes)), "--rounds", str(rounds)]
        subprocess.run(cmd, env=env, check=True, timeout=3600)
        return json.loads(out.read_text())


def report(rows: list[dict], rounds: int, mode: str, link_rate: str | None) -> None:
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    link = f"link capped at {link_rate} each way (tbf)" if link_rate else "link uncapped"
    print(f"\n=== 2 hosts x 2 ranks, {mode}, {link}: us per allreduce, best of {rounds} rounds ===")
    print(f"(commit {commit}; link bytes per call / tensor bytes in brackets)")
    head = " | ".join(f"{m:>15}" for m in METHODS)
    print(f"{'size':>6} | {head} | {'hier/flat':>9}")
    for row in rows:
        cells = " | ".join(f"{row[m] * 1e6:9.1f} [{row['link'][m]:3.1f}]" for m in METHODS)
        print(f"{_fmt_bytes(row['bytes']):>6} | {cells} | {row['mpi'] / row['hier']:8.2f}x")
    print("(hier/flat: flat MPI's time over hier's; above 1 hier is faster)")


def worker(out_path: str, sizes: list[int], rounds: int) -> None:
    import numpy as np
    import torch
    from mpi4py import MPI

    from clusterkernel import comm, metrics

    torch.set_num_threads(1)
    metrics.enable(False)  # the same for every method; this measures the data path
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    stats = Path(os.environ["HIER_LINK_STATS"])

    def link_bytes() -> int:
        return sum(int((stats / f).read_text()) for f in ("rx_bytes", "tx_bytes"))

    rows = []
    for nb in sizes:
        count = nb // 4
        arr = np.zeros(count, dtype=np.float32)  # zeros stay zeros under repeated sums
        ts = {m: torch.zeros(count) for m in ("mpi", "hier", "ring")}
        methods = {
            "mpi4py": lambda arr=arr: world.Allreduce(MPI.IN_PLACE, arr),
            "mpi": lambda t=ts["mpi"]: comm.all_reduce(t, algorithm="mpi"),
            "hier": lambda t=ts["hier"]: comm.all_reduce(t, algorithm="hier"),
            "ring": lambda t=ts["ring"]: comm.all_reduce(t, algorithm="ring"),
        }
        link, iters = {}, {}
        for name, fn in methods.items():  # warm-up (set-up, segment growth), link bytes
            fn()
            world.Barrier()
            before = link_bytes() if rank == 0 else 0
            world.Barrier()
            t0 = time.perf_counter()
            fn()
            once = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            world.Barrier()
            link[name] = (link_bytes() - before) / nb if rank == 0 else 0.0
            # A slow method gets fewer calls (about MEASURE_SECONDS per measurement).
            iters[name] = max(3, min(_iters(nb), int(MEASURE_SECONDS / once)))
        ways = {
            name: (lambda fn=fn, k=iters[name]: time_calls(world, fn, k))
            for name, fn in methods.items()
        }
        # interleaved: noise hits every method alike; the same order on every rank
        best = {name: min(ts) for name, ts in h.interleaved(ways, rounds, rotate=False).items()}
        best["bytes"] = nb
        best["link"] = link
        rows.append(best)
    if rank == 0:
        Path(out_path).write_text(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4KB,64KB,1MB,4MB,16MB,64MB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default=",".join(MODES), help="of: " + ", ".join(MODES))
    ap.add_argument(
        "--link-rate",
        default="none",
        help="comma-separated tc rates for the link, e.g. none,10gbit,1gbit (none: uncapped)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [_parse_bytes(s) for s in args.sizes.split(",")]
    if args.worker:
        sys.path.insert(0, str(REPO))
        worker(args.worker, sizes, args.rounds)
    else:
        rates = [None if r == "none" else r for r in args.link_rate.split(",")]
        with h.mpi_lock():
            for rate in rates:
                for mode in args.modes.split(","):
                    rows = run_job(sizes, args.rounds, MODES[mode], rate)
                    report(rows, args.rounds, mode, rate)


if __name__ == "__main__":
    main()
