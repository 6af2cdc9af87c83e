"""Is a 64 MB allreduce's time steady from one job to the next? (issue 27 item 7)

Run from the repository root::

    python benchmarks/bench_64mb_spread.py              # 10 jobs of 2 ranks
    python benchmarks/bench_64mb_spread.py --jobs 5 --ranks 4

Each job is a fresh ``mpiexec -n N``: the default ``comm.all_reduce`` of a plain
64 MB float32 tensor and raw mpi4py (``Allreduce(IN_PLACE, ndarray)``) on an array of
the same size, interleaved, 12 calls each after 3 warm-up calls. Per job it prints
the median of each (slowest rank per call), what ``auto`` ran (from the timing
record), whether the tensor's pages became huge pages (``AnonHugePages`` of its
mapping), how often the ranks were preempted inside the timed calls (involuntary
context switches, summed over ranks and calls), and at the end the spread over jobs
(min, median, max). ``--bind`` runs the jobs with each rank bound to its own core.

What each rank did inside the timed comm calls, to tell a slow job's cause (issue 27
item 7): the CPUs it ran on (``/proc/self/stat`` field 39) and on how many calls both
ranks started on the same CPU, per call its migrations (``/proc/self/sched``), its
voluntary/involuntary context switches and minor page faults (``getrusage``), and CPU
seconds per wall second (1.00: never off its CPU); per job the VM's steal time, a
cache-line ping-pong between the ranks before and after (how far apart their cores
are) and each rank's in-cache copy speed alone (how fast its core runs right now).
To force a placement: ``--pin same`` (every rank sets its affinity to CPU 0) or
``--pin split`` (rank r on CPU r); ``--load K [--load-cpu C]`` runs K busy loops
beside the jobs (started and killed by the script). ``--segments K`` times K fresh
segments one after the other in each job instead (``--jobs 1 --segments 10``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import _harness as h  # noqa: E402

MB = 1 << 20
CALLS = 12


def _counters() -> dict:
    """This process's scheduler counters now: the CPU it runs on (``/proc/self/stat``
    field 39), migrations between CPUs, voluntary and involuntary context switches,
    minor page faults and CPU seconds (``/proc/self/sched``, ``getrusage``)."""
    with open("/proc/self/stat") as f:
        cpu = int(f.read().rsplit(")", 1)[1].split()[36])
    mig = 0
    with open("/proc/self/sched") as f:
        for line in f:
            if line.startswith("se.nr_migrations"):
                mig = int(line.split(":")[1])
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "cpu": cpu,
        "mig": mig,
        "vcsw": ru.ru_nvcsw,
        "ivcsw": ru.ru_nivcsw,
        "minflt": ru.ru_minflt,
        "cpu_s": ru.ru_utime + ru.ru_stime,
    }


def _steal() -> float:
    """Milliseconds the hypervisor ran something else on this VM's CPUs (``/proc/stat``)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) * 1000 / os.sysconf("SC_CLK_TCK")


def _ping_pong(world, rounds: int = 20000) -> float:
    """Microseconds per round trip of one cache line between ranks 0 and 1 (a shared
    window; each spins on the other's store): how far apart their cores are."""
    import numpy as np
    from mpi4py import MPI

    rank = world.Get_rank()
    win = MPI.Win.Allocate_shared(64 if rank == 0 else 0, 1, comm=world)
    mem, _ = win.Shared_query(0)
    line = np.frombuffer(mem, dtype=np.int64, count=8)
    line[:] = 0
    world.Barrier()
    t0 = time.perf_counter()
    if rank in (0, 1):
        for i in range(1, rounds + 1):
            if rank == 0:
                line[0] = i
                while line[1] != i:
                    pass
            else:
                while line[0] != i:
                    pass
                line[1] = i
    took = (time.perf_counter() - t0) / rounds * 1e6
    world.Barrier()
    win.Free()
    return took


_C_PING_PONG = r"""
#include <sched.h>
#include <stdint.h>
#include <time.h>
/* ns per round trip of a cache line between two processes: rank 0 stores i to
   flags[0] and waits for flags[8] == i (the next cache line); rank 1 the reverse.
   After 1000 empty spins a waiter yields, so two ranks on one CPU still finish. */
double ping_pong(int64_t *flags, int rank, int64_t first, int rounds) {
    struct timespec a, b;
    int64_t *mine = rank == 0 ? flags : flags + 8, *theirs = rank == 0 ? flags + 8 : flags;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int64_t i = first; i < first + rounds; i++) {
        if (rank == 0) __atomic_store_n(mine, i, __ATOMIC_RELEASE);
        for (int spin = 0; __atomic_load_n(theirs, __ATOMIC_ACQUIRE) != i; spin++)
            if (spin > 1000) { sched_yield(); spin = 0; }
        if (rank != 0) __atomic_store_n(mine, i, __ATOMIC_RELEASE);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / rounds;
}
"""


def build_c_ping_pong() -> str:
    """Compile :data:`_C_PING_PONG` with ``cc`` into a temporary shared library; its path."""
    import subprocess
    import tempfile

    folder = tempfile.mkdtemp(prefix="ck-pingpong-")
    src, lib = os.path.join(folder, "pp.c"), os.path.join(folder, "pp.so")
    with open(src, "w") as f:
        f.write(_C_PING_PONG)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib, src], check=True)
    return lib


class _CPingPong:
    """The C ping-pong between ranks 0 and 1 over a shared window, run between calls."""

    def __init__(self, world, lib: str, rounds: int = 2000):
        import ctypes

        import numpy as np
        from mpi4py import MPI

        self.world, self.rounds, self.next = world, rounds, 1
        self.rank = world.Get_rank()
        self.win = MPI.Win.Allocate_shared(128 if self.rank == 0 else 0, 1, comm=world)
        mem, _ = self.win.Shared_query(0)
        self.flags = np.frombuffer(mem, dtype=np.int64, count=16)
        self.flags[:] = 0
        fn = ctypes.CDLL(lib).ping_pong
        fn.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int)
        fn.restype = ctypes.c_double
        self.fn = fn

    def __call__(self) -> float:
        """ns per round trip now (measured on ranks 0 and 1; the others return 0)."""
        self.world.Barrier()
        ns = 0.0
        if self.rank in (0, 1):
            ns = self.fn(self.flags.ctypes.data, self.rank, self.next, self.rounds)
        self.next += self.rounds
        return self.world.bcast(ns, root=0)

    def close(self) -> None:
        self.world.Barrier()
        self.win.Free()


def _cache_copy_gbs(reps: int = 4000) -> float:
    """GB/s of this rank copying 256 KB to 256 KB (both in its core's cache), alone on
    its core: how fast this core runs cache-resident work right now."""
    import torch

    x = torch.ones(64 * 1024)
    y = torch.empty_like(x)
    for _ in range(100):
        y.copy_(x)
    t0 = time.perf_counter()
    for _ in range(reps):
        y.copy_(x)
    return reps * x.nbytes / (time.perf_counter() - t0) / 1e9


def worker(pp_lib: str | None = None) -> None:
    import torch
    from mpi4py import MPI

    from clusterkernel import comm, metrics
    from clusterkernel.comm._hugepages import huge_kb

    world = MPI.COMM_WORLD
    n = 64 * MB // 4
    t = torch.ones(n)
    a = t.numpy().copy()
    times: dict[str, list[float]] = {"comm": [], "mpi4py": []}
    mine: list[float] = []  # this rank's own time per timed comm call
    switches = dict.fromkeys(times, 0)  # involuntary context switches inside the calls
    # Per timed comm call, this rank's counters before and after it.
    calls: list[tuple[dict, dict]] = []
    pp_before = _ping_pong(world)
    c_pp = _CPingPong(world, pp_lib) if pp_lib else None
    pp_calls: list[float] = []  # C ping-pong right after each timed comm call (ns)
    world.Barrier()
    gbs = _cache_copy_gbs()
    steal0 = _steal()
    for i in range(3 + CALLS):
        for side in ("comm", "mpi4py"):
            world.Barrier()
            c0 = _counters()
            t0 = time.perf_counter()
            if side == "comm":
                comm.all_reduce(t)
            else:
                world.Allreduce(MPI.IN_PLACE, a)
            own = time.perf_counter() - t0
            c1 = _counters()
            took = world.allreduce(own, op=MPI.MAX)
            if i >= 3:
                times[side].append(took)
                switches[side] += world.allreduce(c1["ivcsw"] - c0["ivcsw"])
                if side == "comm":
                    mine.append(own)
                    calls.append((c0, c1))
                    if c_pp is not None:
                        pp_calls.append(c_pp())
    steal = _steal() - steal0
    if c_pp is not None:
        c_pp.close()
    pp_after = _ping_pong(world)
    alg = metrics.recorder().comm[-1][2]
    huge = world.gather(huge_kb(t.data_ptr()), root=0)

    def delta(key: str) -> int:
        return sum(c1[key] - c0[key] for c0, c1 in calls)

    me = {
        "cpus": sorted({c[k]["cpu"] for c in calls for k in (0, 1)}),
        "cpu_seq": [c0["cpu"] for c0, _ in calls],
        "mig": delta("mig") / CALLS,
        "vcsw": delta("vcsw") / CALLS,
        "ivcsw": delta("ivcsw") / CALLS,
        "minflt": delta("minflt") / CALLS,
        # CPU seconds per wall second inside the calls: 1.0 means it never waited off-CPU
        "busy": sum(c1["cpu_s"] - c0["cpu_s"] for c0, c1 in calls) / sum(mine),
        "own_ms": h.median(mine) * 1e3,
        "cache_gbs": gbs,
    }
    ranks = world.gather(me, root=0)
    if world.Get_rank() == 0:
        # Calls where every rank started on the same CPU as the others.
        shared = sum(len({r["cpu_seq"][k] for r in ranks}) == 1 for k in range(CALLS))
        out = {k: h.median(v) for k, v in times.items()}
        extra = {"alg": alg, "huge_kb": huge, "switches": switches, "ranks": ranks}
        extra["steal_ms"] = steal
        extra["ping_pong_us"] = [pp_before, pp_after]
        extra["comm_calls_ms"] = [x * 1e3 for x in times["comm"]]
        extra["c_ping_pong_ns"] = pp_calls
        print("RESULT " + json.dumps({**out, **extra, "same_cpu_calls": shared}))


def segments_worker(count: int) -> None:
    """``count`` groups of all ranks one after the other in one job, each with its own
    shared-memory segment (fresh pages): the time of a 64 MB all_reduce on each, and the
    ranks' cache-line ping-pong after it. A slow segment beside fast ones of the same
    job would point at where its pages lie; none was seen (BENCHMARKS.md,
    "The 64 MB slow mode and the abort, looked into")."""
    import torch
    from mpi4py import MPI

    from clusterkernel import comm

    world = MPI.COMM_WORLD
    t = torch.ones(64 * MB // 4)
    rows = []
    for _ in range(count):
        g = comm.new_group()
        took = []
        for i in range(3 + 8):
            world.Barrier()
            t0 = time.perf_counter()
            comm.all_reduce(t, group=g)
            dt = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if i >= 3:
                took.append(dt)
        pp = _ping_pong(world, 5000)
        rows.append({"ms": h.median(took) * 1e3, "pp_us": pp})
        comm.destroy_group(g)
    if world.Get_rank() == 0:
        print("RESULT " + json.dumps({"segments": rows}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--bind", action="store_true", help="bind each rank to a core")
    parser.add_argument(
        "--pin",
        choices=["none", "same", "split"],
        default="none",
        help="each rank sets its own affinity: all on CPU 0 (same) or rank r on CPU r (split)",
    )
    parser.add_argument("--load", type=int, default=0, help="busy loops beside the jobs")
    parser.add_argument("--load-cpu", type=int, help="the CPU the busy loops are pinned to")
    parser.add_argument(
        "--segments", type=int, default=0, help="time this many fresh segments per job"
    )
    parser.add_argument(
        "--c-ping-pong",
        action="store_true",
        help="after every timed comm call, a C cache-line ping-pong between ranks 0 and 1",
    )
    parser.add_argument("--pp-lib", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if args.pin != "none":
            ncpu = os.cpu_count() or 1
            rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
            os.sched_setaffinity(0, {0 if args.pin == "same" else rank % ncpu})
        if args.segments:
            segments_worker(args.segments)
        else:
            worker(args.pp_lib)
        return
    if args.segments:
        with h.mpi_lock():
            for job in range(args.jobs):
                r = h.mpi_job(__file__, args.ranks, ["--segments", str(args.segments)])
                for k, seg in enumerate(r["segments"]):
                    print(
                        f"job {job + 1} segment {k + 1}: {seg['ms']:.1f} ms, "
                        f"ping-pong {seg['pp_us']:.2f} us",
                        flush=True,
                    )
        return
    print(
        f"{args.ranks} ranks | comm.all_reduce | mpi4py | comm / mpi4py | auto ran | huge kB"
        " | preempted in comm, mpi4py | CPUs per rank | calls all on one CPU"
        " | per call per rank: migrations, vol./invol. switches, minor faults, CPU/wall"
        " | steal ms | ping-pong us before, after | in-cache copy GB/s per rank"
    )
    print("---|---|---|---|---|---|---|---|---|---|---|---|---")
    pp = ["--pp-lib", build_c_ping_pong()] if args.c_ping_pong else []
    with h.mpi_lock(), h.busy_loops(args.load, args.load_cpu):
        rows = []
        for job in range(args.jobs):
            r = h.mpi_job(
                __file__,
                args.ranks,
                ["--pin", args.pin, *pp],
                bind="core" if args.bind else "none",
            )
            rows.append(r)
            ratio = r["comm"] / r["mpi4py"]
            huge = ", ".join(str(k) for k in r["huge_kb"])
            rk = r["ranks"]
            cpus = " / ".join(",".join(map(str, x["cpus"])) for x in rk)
            counters = " / ".join(
                f"{x['mig']:.1f}, {x['vcsw']:.0f}/{x['ivcsw']:.1f}, {x['minflt']:.0f}, "
                f"{x['busy']:.2f}"
                for x in rk
            )
            print(
                f"job {job + 1} | {r['comm'] * 1e3:.1f} ms | {r['mpi4py'] * 1e3:.1f} ms | "
                f"{ratio:.2f}x | {r['alg']} | {huge} | {r['switches']['comm']}, "
                f"{r['switches']['mpi4py']} | {cpus} | {r['same_cpu_calls']}/{CALLS} | "
                f"{counters} | {r['steal_ms']:.0f} | "
                f"{r['ping_pong_us'][0]:.2f}, {r['ping_pong_us'][1]:.2f} | "
                f"{' / '.join(format(x['cache_gbs'], '.0f') for x in rk)}",
                flush=True,
            )
            if pp:
                pairs = zip(r["comm_calls_ms"], r["c_ping_pong_ns"])
                print(
                    f"    job {job + 1} per call (comm ms, C ping-pong ns after it): "
                    + ", ".join(f"{ms:.1f}/{ns:.0f}" for ms, ns in pairs),
                    flush=True,
                )
    print(f"1-min load average after: {h.load():.2f}")
    for side in ("comm", "mpi4py"):
        v = sorted(r[side] * 1e3 for r in rows)
        print(f"{side}: min {v[0]:.1f} ms, median {h.median(v):.1f}, max {v[-1]:.1f}")


if __name__ == "__main__":
    main()
