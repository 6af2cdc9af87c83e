"""``algorithm="auto"`` (the default): pick MPI, the ring, shared memory or the
hierarchy per call, from a small table of measured crossovers.

A *rule* is, per op, byte limits and the algorithm below each::

    "all_reduce": ((262144, 16777216), ("mpi", "shm", "ring"))
    # < 256 KiB: mpi; < 16 MiB: shm; from 16 MiB: ring

Rules depend on the group: its size and whether it spans nodes. A group gets its
rules at its first ``auto`` call (every member makes it, so the setup may be
collective): the members check that they all make that setup (a rank that called
something else raises :class:`CollectiveMismatchError` with the others, as the
default check would), exchange their host names, and each builds its rules from
the same table. The table comes from, in order: the file named by
``CLUSTERKERNEL_AUTO_TABLE``, this machine's entry in the cache that
:func:`tune` writes (``~/.cache/clusterkernel/comm-auto.json``), or the table
shipped with the package (``auto_table.json``, measured on a 2-core machine).
``CLUSTERKERNEL_ALGORITHM=mpi`` (or ``ring``, ``shm``, ``hier``) forces one
algorithm for every op that has it. If the members' tables differ (different
caches on different machines), group rank 0's rules are used by all.

A tensor from :func:`~clusterkernel.comm.shm_empty` of at least
:data:`ZERO_COPY_MIN` bytes goes to ``"shm"``, which reduces it in place.

Each timing record names the algorithm that ran, so the dashboard shows the
choice; :func:`auto_choice` tells it in advance (for ordinary tensors).

Example::

    comm.auto_choice("all_reduce", 64 << 20)   # 'shm' (one node) or 'hier' (several)
    comm.all_reduce(t)                         # algorithm="auto"
"""

from __future__ import annotations

import json
import os
import platform
from bisect import bisect_right
from pathlib import Path

from mpi4py import MPI

from clusterkernel.comm import _check, _shm_alloc
from clusterkernel.comm._errors import CommError
from clusterkernel.comm._groups import Group, resolve
from clusterkernel.comm._ops import ALGORITHMS

# The ops whose calls take ``algorithm=``; the *_tensor and coalesced variants use
# the rule of the op they move data like.
OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
RULE_OF = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "broadcast": "broadcast",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
}
# What each op can run (the hierarchy exists only for all_reduce, the ring only for
# all_reduce; every op has MPI and shared memory).
CANDIDATES = {
    "all_reduce": tuple(a for a in ("mpi", "ring", "shm", "hier") if a in ALGORITHMS),
    "broadcast": ("mpi", "shm"),
    "all_gather": ("mpi", "shm"),
    "reduce_scatter": ("mpi", "shm"),
}
# A tensor from comm.shm_empty is reduced in place by "shm", with no copy in or out:
# measured faster than MPI from 256 KB on 2 ranks and from 1 MB on 4 (BENCHMARKS.md,
# issue 13), so from this size auto sends such tensors to "shm" whatever the table.
ZERO_COPY_MIN = 1 << 20
SHIPPED = Path(__file__).with_name("auto_table.json")
ENV_ALGORITHM = "CLUSTERKERNEL_ALGORITHM"
ENV_TABLE = "CLUSTERKERNEL_AUTO_TABLE"


def cache_path() -> Path:
    """Where :func:`tune` keeps this user's measured tables (one entry per machine)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "clusterkernel" / "comm-auto.json"


def machine_id() -> str:
    """What a measured table is valid for: CPU architecture and count, MPI library.

    Not the host name, so one tuning serves every node of a cluster of equal nodes.
    """
    lib = MPI.Get_library_version().strip().splitlines()[0]
    return f"{platform.machine()}, {os.cpu_count()} cpus, {lib}"


def _load_table() -> tuple[list[dict], str]:
    """This rank's table of rules and where it came from."""
    path = os.environ.get(ENV_TABLE)
    if path:
        try:
            return json.loads(Path(path).read_text())["rules"], path
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CommError(
                f"{ENV_TABLE}={path} is not a readable table ({exc}); make one with "
                "comm.tune() or unset the variable"
            ) from None
    try:
        cached = json.loads(cache_path().read_text())
        entry = cached["machines"][machine_id()]
        return entry["rules"], str(cache_path())
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no cache for this machine: the shipped table
    return json.loads(SHIPPED.read_text())["rules"], "shipped"


def _forced() -> str | None:
    name = os.environ.get(ENV_ALGORITHM, "").strip().lower()
    if name in ("", "auto"):
        return None
    if name not in ALGORITHMS:
        raise CommError(
            f"{ENV_ALGORITHM}={name!r} is not an algorithm; use one of {ALGORITHMS} (or unset it)"
        )
    return name


def rules_for(table: list[dict], nodes: int, size: int, forced: str | None = None) -> dict:
    """Per op ``(limits, algorithms)`` for a group of ``size`` ranks on ``nodes`` nodes.

    Takes the table's rule for the same node layout (one node, or several) with the
    nearest group size; an algorithm the layout cannot run (shared memory across
    nodes, the hierarchy on one node) becomes ``"mpi"``.
    """
    rules = {}
    for op, allowed in CANDIDATES.items():
        usable = tuple(
            a
            for a in allowed
            if not (a == "shm" and nodes > 1) and not (a == "hier" and nodes == 1)
        )
        if forced is not None and forced in usable:
            rules[op] = ((), (forced,))
            continue
        rows = [r for r in table if r["op"] == op and (r["nodes"] > 1) == (nodes > 1)]
        if not rows:
            rules[op] = ((), ("mpi",))
            continue
        row = min(rows, key=lambda r: (abs(r["ranks"] - size), r["ranks"]))
        algs = tuple(a if a in usable else "mpi" for a in row["algs"])
        rules[op] = (tuple(row["limits"]), algs)
    return rules


def setup(g: Group, name: str) -> dict:
    """The group's rules, made at its first ``auto`` call (collective over ``g``)."""
    # Every member must be making an auto call now: checked like any collective, so
    # a rank that called something else raises with the others instead of hanging.
    _check.verify(g, name, None, alg="auto")
    try:
        table, _ = _load_table()
        forced = _forced()
        mine = (MPI.Get_processor_name(), json.dumps([table, forced], sort_keys=True), None)
    except CommError as exc:
        mine = (MPI.Get_processor_name(), "", str(exc))
    everyone = g.inner().allgather(mine)
    errors = [f"rank {g.ranks[i]}: {e[2]}" for i, e in enumerate(everyone) if e[2]]
    if errors:
        raise CommError("algorithm='auto' cannot start:\n  " + "\n  ".join(errors))
    nodes = len({e[0] for e in everyone})
    if any(e[1] != everyone[0][1] for e in everyone):
        table, forced = json.loads(everyone[0][1])  # different tables: group rank 0's
    rules = rules_for(table, nodes, g.size, forced)
    g._auto = rules
    return rules


def zero_copy(g: Group, tensor, nbytes: int, algorithm: str) -> str:
    """``"shm"`` for a large tensor inside one of ``g``'s :func:`shm_empty` allocations.

    Decided on each rank from its own tensor: every rank passes such a tensor, or
    the check names the ranks whose algorithm differs.
    """
    seg = g._shm
    if nbytes >= ZERO_COPY_MIN and seg is not None and seg.arenas:
        if tensor.is_contiguous() and _shm_alloc.find(seg, tensor)[0]:
            return "shm"
    return algorithm


def choose(g: Group, name: str, nbytes: int) -> str:
    """The algorithm ``auto`` runs for call ``name`` of ``nbytes`` on ``g``."""
    rules = g._auto
    if rules is None:
        rules = setup(g, name)
    limits, algs = rules[RULE_OF[name]]
    return algs[bisect_right(limits, nbytes)]


def auto_choice(op: str, nbytes: int, group: Group | None = None) -> str:
    """Which algorithm ``algorithm="auto"`` picks for ``op`` on ``nbytes`` bytes.

    The first call on a group sets its rules up, collectively: call it on every
    member, like the op itself.

    Example: ``comm.auto_choice("all_reduce", 4 << 20)`` (e.g. ``'shm'``)
    """
    if op not in RULE_OF:
        raise ValueError(f"auto_choice: op must be one of {sorted(RULE_OF)}, got {op!r}")
    g = resolve(group)
    g.member_comm()
    return choose(g, op, nbytes)
