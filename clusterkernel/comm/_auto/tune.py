"""Measure ``algorithm="auto"``'s table on this machine: :func:`tune`.

For each op and size, every algorithm the group can run is timed side by side
(interleaved over a few rounds; a time is the slowest rank's mean per call, the
best round kept), the fastest wins, and the crossovers become the group's rules
(:mod:`._auto`). A simpler algorithm keeps a size unless another is clearly
faster (by :data:`MARGIN`), so noise does not flip the table.

Run it once per machine (it takes seconds) from every rank::

    %%mpi
    table = comm.tune()            # measures, caches, and applies to the world group
    print(table["all_reduce"]["algs"], table["all_reduce"]["limits"])

Or from a shell, to write a table file (``CLUSTERKERNEL_AUTO_TABLE`` reads one)::

    mpiexec -n 4 python -m clusterkernel.comm._auto.table --out table.json
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings

import torch
from mpi4py import MPI

from clusterkernel import metrics
from clusterkernel.comm import _auto, _plan
from clusterkernel.comm._flight import FLIGHT
from clusterkernel.comm._gathers import all_gather_into_tensor, broadcast
from clusterkernel.comm._groups import Group, resolve
from clusterkernel.comm._reductions import all_reduce, reduce_scatter_tensor

KB, MB = 1 << 10, 1 << 20
SIZES = (4 * KB, 16 * KB, 64 * KB, 256 * KB, 1 * MB, 4 * MB, 16 * MB, 64 * MB)
MARGIN = 0.05  # another algorithm must be this much faster to take a size
_PREFERENCE = ("mpi", "shm", "ring", "hier")  # simplest first: the tie-breaker
_BYTES_PER_TIMING = 32 * MB


def _call(op: str, alg: str, g: Group, nbytes: int):
    """A no-argument function making one ``op`` call of ``nbytes`` (auto's measure)."""
    # float32 zeros (sums in place stay finite), divisible by the group size
    n = max(g.size, nbytes // 4 // g.size * g.size)
    if op == "all_reduce":
        t = torch.zeros(n)
        return lambda: all_reduce(t, group=g, algorithm=alg)
    if op == "broadcast":
        t = torch.zeros(n)
        src = g.ranks[0]
        return lambda: broadcast(t, src=src, group=g, algorithm=alg)
    if op == "all_gather":  # auto's measure: the gathered output
        out, inp = torch.empty(n), torch.zeros(n // g.size)
        return lambda: all_gather_into_tensor(out, inp, group=g, algorithm=alg)
    if op == "reduce_scatter":  # auto's measure: the input
        out, inp = torch.empty(n // g.size), torch.zeros(n)
        return lambda: reduce_scatter_tensor(out, inp, group=g, algorithm=alg)
    raise ValueError(f"tune: unknown op {op!r}; use some of {_auto.OPS}")


def _seconds(fn, iters: int, inner: MPI.Intracomm) -> float:
    fn()  # warm-up: first-use setup (segments, plans) is not what auto chooses on
    inner.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    mine = (time.perf_counter() - t0) / iters
    return inner.allreduce(mine, op=MPI.MAX)


def _rule(sizes: tuple[int, ...], times: dict[str, list[float]]) -> tuple[list, list]:
    """Crossover limits and algorithms from per-size times (same on every rank)."""
    winners = []
    for i in range(len(sizes)):
        ranked = [a for a in _PREFERENCE if a in times]
        best = ranked[0]
        for a in ranked[1:]:
            if times[a][i] < times[best][i] * (1 - MARGIN):
                best = a
        winners.append(best)
    limits, algs = [], [winners[0]]
    for i in range(1, len(sizes)):
        if winners[i] != algs[-1]:
            limits.append(int(math.sqrt(sizes[i - 1] * sizes[i])))  # midway, in log size
            algs.append(winners[i])
    return limits, algs


def tune(
    group: Group | None = None,
    ops: tuple[str, ...] = _auto.OPS,
    sizes: tuple[int, ...] = SIZES,
    rounds: int = 3,
    save: bool = True,
) -> dict[str, dict]:
    """Time every algorithm per op and size on ``group``; return and apply the table.

    Collective: call it on every member. The result is ``{op: {"limits", "algs",
    "sizes", "times"}}`` (seconds per call, slowest rank, best round). The tuned
    ops' rules replace ``group``'s at once (other groups already set up keep
    theirs; new groups read the cache). With ``save``, group rank 0 stores them as
    this machine's entry in :func:`~clusterkernel.comm._auto.cache_path` (private
    to the user), where later jobs' ``auto`` calls find them; a cache that cannot be
    written is a warning, not an error. Metrics and the flight recorder are paused
    meanwhile, so the dashboard does not show the probes.

    Example::

        # not run: it measures for a while and replaces this machine's table for every job
        comm.tune()["all_reduce"]["algs"]   # e.g. ['mpi', 'shm', 'ring']
    """
    g = resolve(group)
    g.member_comm()  # a clear error for a non-member
    unknown = [op for op in ops if op not in _auto.CANDIDATES]
    if unknown:
        raise ValueError(f"tune: unknown ops {unknown}; use some of {_auto.OPS}")
    sizes = tuple(sizes)
    if (
        not sizes
        or any(not isinstance(s, int) or s < 4 for s in sizes)
        or list(sizes) != sorted(set(sizes))
    ):
        raise ValueError(f"tune: sizes must be increasing byte counts >= 4, got {sizes!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"tune: rounds must be a positive int, got {rounds!r}")
    base = g._auto if g._auto is not None else _auto.setup(g, "all_reduce")
    inner = g.inner()
    nodes = _auto.node_count(g)
    rec = metrics.recorder()
    was = rec.enabled, FLIGHT.on
    rec.enabled, FLIGHT.on = False, False
    try:
        result = {}
        for op in ops:
            algs = list(_auto.usable(op, nodes))
            times: dict[str, list[float]] = {a: [math.inf] * len(sizes) for a in algs}
            for i, nbytes in enumerate(sizes):
                fns = {a: _call(op, a, g, nbytes) for a in algs}
                iters = max(3, min(200, _BYTES_PER_TIMING // nbytes))
                for r in range(rounds):
                    for a in algs[r % len(algs) :] + algs[: r % len(algs)]:  # rotate order
                        times[a][i] = min(times[a][i], _seconds(fns[a], iters, inner))
                del fns
            limits, chosen = _rule(tuple(sizes), times)
            result[op] = {"limits": limits, "algs": chosen, "sizes": list(sizes), "times": times}
    finally:
        rec.enabled, FLIGHT.on = was
    rows = [table_row(op, nodes, g.size, r) for op, r in result.items()]
    new = _auto.rules_for(rows, nodes, g.size, base["forced"])
    g._auto = {k: new[k] if k in ops else v for k, v in base.items()}
    _plan.forget(g)  # plans resolved "auto" with the old rules
    if save and g.rank == 0:
        try:
            _store(rows)
        except OSError as exc:  # the rules apply anyway; only later jobs miss them
            warnings.warn(f"comm.tune: could not cache the table ({exc})", stacklevel=2)
    return result


def table_row(op: str, nodes: int, ranks: int, r: dict) -> dict:
    """One row of a table file: the rule of ``op`` for this layout, with its times."""
    return {
        "op": op,
        "nodes": nodes,
        "ranks": ranks,
        "limits": r["limits"],
        "algs": r["algs"],
        "sizes": r["sizes"],
        "times": {a: [round(t, 9) for t in ts] for a, ts in r["times"].items()},
    }


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` with the rows for the same (op, one node or several, ranks) replaced."""

    def key(r: dict) -> tuple:
        return r["op"], r["nodes"] > 1, r["ranks"]

    replaced = {key(r) for r in new}
    kept = [r for r in old if key(r) not in replaced]
    return sorted(kept + new, key=lambda r: (r["op"], r["nodes"], r["ranks"]))


def _store(rows: list[dict]) -> None:
    path = _auto.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        machines = json.loads(path.read_text())["machines"]
    except _auto._UNREADABLE:
        machines = {}
    entry = machines.get(_auto.machine_id(), {"rules": []})
    machines[_auto.machine_id()] = {"rules": merge_rows(entry.get("rules", []), rows)}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"version": 1, "machines": machines}, f, indent=1)
    os.replace(tmp, path)
