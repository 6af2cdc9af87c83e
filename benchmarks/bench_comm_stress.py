"""Stress ``algorithm="auto"`` while it adapts: do the ranks of a group ever run
different algorithms in one call?

Run from the repository root (it takes the benchmark lock itself)::

    python benchmarks/bench_comm_stress.py --ranks 2 4 --calls 3000
    python benchmarks/bench_comm_stress.py --ranks 2 --calls 500 --seed 7

Every rank draws the same sequence of calls from ``--seed``: ``comm.all_reduce`` of
64 B to 64 MB (weighted to the adaptive sizes, 256 KB and up), float32/64, float16,
bfloat16, int32 and int64, SUM/AVG/MAX; contiguous tensors, transposed and strided
views, views that alias one buffer (overlapping slices, a tensor reused for many
calls), slices of a ``comm.shm_empty`` allocation (the zero-copy path); on the world
group, a second group of the same ranks and a pair group per two ranks; some calls
async, some with an explicit ``algorithm=``, some ``all_reduce_coalesced``; and
point-to-point traffic between two ranks only (their plan caches fill and start
afresh at other times than the others'). Adapting is on
(``CLUSTERKERNEL_AUTO_ADAPT=1``).

The debug check: before any algorithm of all_reduce runs (the run functions the
plans call, and the coalesced path), the group's ranks allgather its name and
raise on a mismatch, so a divergence is caught at the call where it starts instead
of hanging. After each call every rank's list of algorithms run, and the C path's
hits, are compared across the group; every 100 calls the groups' arms
(``comm.auto_state``) too. Every result is checked. A rank that makes no progress
for ``--hang`` seconds dumps every thread's stack and ends the job.

Prints per rank count: calls made, how many ran under an adaptive arm, switches and
probes seen, and either "no mismatch" or the first mismatch found.

What it cannot see: the check's MPI calls between every two calls let MPI progress,
so a hang that needs two calls back to back with no MPI call between (a ring call,
then a shared-memory one that waited without letting MPI progress: BENCHMARKS.md,
"Collectives") does not happen here; ``bench_comm.py`` found that one.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from _harness import mpi_lock  # noqa: E402

KB, MB = 1024, 1024 * 1024
# bytes and weight: most calls where auto adapts (from 256 KB), a few huge ones
SIZES = [
    (64, 4),
    (4 * KB, 6),
    (64 * KB, 4),
    (256 * KB, 10),
    (300 * KB, 6),
    (512 * KB, 10),
    (1 * MB, 12),
    (3 * MB, 6),
    (4 * MB, 8),
    (16 * MB, 3),
    (64 * MB, 1),
]
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]
LAYOUTS = ["fresh", "reused", "transposed", "strided", "alias", "shm"]
SHM_BYTES = 16 * MB  # per group: the zero-copy slices come from here


class Mismatch(RuntimeError):
    """The ranks of a group chose different algorithms for one call."""


def worker(out_path: str, calls: int, seed: int, hang: float) -> None:
    import numpy as np
    import torch
    from mpi4py import MPI

    from clusterkernel import comm
    from clusterkernel.comm import _fastpath, _fusion, _reductions

    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    faulthandler.dump_traceback_later(hang, exit=True)

    ran: list[str] = []  # the algorithms run in the current call, on this rank

    def agreed_run(alg: str, fn):
        def run(plan, g, *args):
            names = g.inner().allgather(alg)
            if len(set(names)) > 1:
                raise Mismatch(f"{g.name} ranks {list(g.ranks)} about to run {names}")
            ran.append(alg)
            return fn(plan, g, *args)

        return run

    # every plan made from here on runs through the check (plans keep the function)
    for alg, fn in list(_reductions._RUNS.items()):
        _reductions._RUNS[alg] = agreed_run(alg, fn)
    plain_buckets = _fusion._run_buckets

    def buckets(g, c, tensors, bks, key, nbytes, op, algorithm, *rest):
        names = g.inner().allgather(algorithm)
        if len(set(names)) > 1:
            raise Mismatch(f"coalesced on {g.name}: about to run {names}")
        ran.append(algorithm)
        return plain_buckets(g, c, tensors, bks, key, nbytes, op, algorithm, *rest)

    _fusion._run_buckets = buckets

    groups = {"world": comm.WORLD, "again": comm.new_group(list(range(n)))}
    pairs = [comm.new_group([a, a + 1]) for a in range(0, n - 1, 2)]
    mine = [p for p in pairs if rank in p.ranks]
    if mine:
        groups["pair"] = mine[0]
    arenas = {name: comm.shm_empty(SHM_BYTES // 4, group=g) for name, g in groups.items()}
    reused: dict = {}
    alias = torch.empty(68 * MB, dtype=torch.uint8)
    rng = np.random.default_rng(seed)  # the same draws on every rank
    sizes, weights = zip(*SIZES, strict=True)
    p = np.array(weights, dtype=float) / sum(weights)

    def tensor(kind: str, dtype, count: int, gname: str):
        if kind == "fresh":
            return torch.empty(count, dtype=dtype)
        if kind == "reused":  # one buffer per size and dtype, as gradient buffers are
            return reused.setdefault((count, dtype), torch.empty(count, dtype=dtype))
        if kind == "transposed":
            rows = 2 if count % 2 == 0 else 1
            return torch.empty(count // rows, rows, dtype=dtype).t()
        if kind == "strided":
            return torch.empty(2 * count, dtype=dtype)[::2]
        # an overlapping slice of one buffer that every dtype shares, or of the
        # group's shm_empty allocation; the offset a multiple of 64 elements
        base = alias if kind == "alias" else arenas[gname].view(torch.uint8)
        base = base.view(dtype)
        off = int(where * max(0, base.numel() - count) / 64) * 64
        return base[off : off + count]

    stats: Counter = Counter()
    first_problem = None
    adaptive_calls = 0
    p2p_sizes = iter(range(1, 1 << 20))
    for i in range(calls):
        faulthandler.dump_traceback_later(hang, exit=True)
        gname = str(rng.choice(["world", "again", "pair"]))
        if gname == "pair" and n % 2:  # an odd count: not every rank has a pair
            gname = "again"
        where = rng.random()  # drawn on every rank whatever the call
        nbytes = int(rng.choice(sizes, p=p))
        dtype = getattr(torch, str(rng.choice(DTYPES)))
        kind = str(rng.choice(LAYOUTS, p=[0.2, 0.3, 0.1, 0.1, 0.15, 0.15]))
        if kind == "shm" and nbytes > SHM_BYTES:
            kind = "reused"
        opname = str(rng.choice(["SUM", "SUM", "AVG", "MAX"]))
        if opname == "AVG" and not dtype.is_floating_point:
            opname = "SUM"
        how = str(rng.choice(["auto"] * 14 + ["async", "explicit", "coalesced"]))
        explicit = str(rng.choice(["mpi", "ring", "shm"]))
        churn = rng.random() < 0.2
        g = groups[gname]
        itemsize = torch.empty(0, dtype=dtype).element_size()
        count = max(1, nbytes // itemsize)
        members = [r + 1 for r in g.ranks]
        me = rank + 1
        if opname == "SUM":
            want = float(sum(members))
        elif opname == "AVG":
            want = sum(members) / len(members)
        else:
            want = float(max(members))
        op = getattr(comm, opname)
        ran.clear()
        hits = _fastpath.hits()
        problem = None
        try:
            if how == "coalesced":
                ts = [tensor("fresh", dtype, max(1, count // 3), gname) for _ in range(3)]
                for x in ts:
                    x.fill_(me)
                comm.all_reduce_coalesced(ts, op=op, group=g)
                ok = all(bool((x.double() == want).all()) for x in ts)
            else:
                t = tensor(kind, dtype, count, gname)
                t.fill_(me)
                if how == "async":
                    comm.all_reduce(t, op=op, group=g, async_op=True).wait()
                elif how == "explicit":
                    comm.all_reduce(t, op=op, group=g, algorithm=explicit)
                else:
                    comm.all_reduce(t, op=op, group=g)
                ok = bool((t.double() == want).all())
            if not ok:
                problem = f"call {i}: wrong result ({how} {kind} {dtype} {nbytes} B {opname})"
        except Mismatch as exc:
            problem = f"call {i} ({how} {kind} {dtype} {nbytes} B on {gname}): {exc}"
        hits = _fastpath.hits() - hits
        if churn and n >= 2 and rank in (0, 1):  # plans on ranks 0 and 1 only
            k = next(p2p_sizes)
            buf = torch.zeros(k % 4096 + 1)
            if rank == 0:
                comm.send(buf, dst=1, tag=7)
            else:
                comm.recv(buf, src=0, tag=7)
        seen = world.allgather((gname, g.ranks, list(ran), hits, problem))
        peers = [s for s in seen if s[1] == g.ranks]
        if how in ("auto", "coalesced") and nbytes >= 256 * KB:
            adaptive_calls += 1
        stats[f"{how}:{'+'.join(ran) or 'C'}"] += 1
        problems = [s[4] for s in seen if s[4]]
        if not problems and len({(tuple(s[2]), s[3] > 0) for s in peers}) > 1:
            problems = [f"call {i} on {gname}: the ranks ran {[(s[2], s[3]) for s in peers]}"]
        if i % 100 == 99 or i == calls - 1:
            states = [(k, gr.ranks, repr(comm.auto_state(gr))) for k, gr in groups.items()]
            views: dict = {}
            for k, ranks, text in sum(world.allgather(states), []):
                views.setdefault((k, ranks), set()).add(text)
            for (k, ranks), texts in views.items():
                if len(texts) > 1:
                    problems.append(f"after call {i}: the arms of {k} {ranks} differ: {texts}")
        if problems:
            first_problem = problems[0]
            break
    faulthandler.cancel_dump_traceback_later()
    arms = {k: {str(a): s for a, s in comm.auto_state(gr).items()} for k, gr in groups.items()}
    if rank == 0:
        Path(out_path).write_text(
            json.dumps(
                {
                    "calls": i + 1,
                    "adaptive_calls": adaptive_calls,
                    "problem": first_problem,
                    "ran": dict(stats.most_common()),
                    "arms": arms,
                },
                indent=1,
                default=str,
            )
        )


def run_job(n: int, calls: int, seed: int, hang: float, env_extra: dict) -> dict:
    sys.path.insert(0, str(REPO))
    from clusterkernel.client.mpiexec import MPIRuntime

    rt = MPIRuntime.detect()
    env = rt.env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env["CLUSTERKERNEL_AUTO_ADAPT"] = "1"
    env.update(env_extra)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [*rt.command(n), sys.executable, __file__, "--worker", str(out)]
        cmd += ["--calls", str(calls), "--seed", str(seed), "--hang", str(hang)]
        proc = subprocess.run(cmd, env=env, timeout=3600)
        if proc.returncode != 0 or not out.exists():
            return {"problem": f"the job ended with code {proc.returncode} (a hang dumps stacks)"}
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hang", type=float, default=120.0, help="seconds without progress")
    ap.add_argument("--env", nargs="*", default=[], help="NAME=VALUE for the ranks")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        sys.path.insert(0, str(REPO))
        worker(args.worker, args.calls, args.seed, args.hang)
        return
    extra = dict(e.split("=", 1) for e in args.env)
    with mpi_lock():
        for n in args.ranks:
            res = run_job(n, args.calls, args.seed, args.hang, extra)
            print(f"\n=== {n} ranks, seed {args.seed} ===")
            print(json.dumps(res, indent=1))
            print("result:", res.get("problem") or "no mismatch")


if __name__ == "__main__":
    main()
