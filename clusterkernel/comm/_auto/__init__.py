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
caches on different machines), group rank 0's rules are used by all. The same
exchange agrees on whether the group adapts (:mod:`.adapt`: on unless
``CLUSTERKERNEL_AUTO_ADAPT=0``; group rank 0's answer where ranks differ), so the
algorithm a call runs never depends on what one rank's environment says.

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
import zlib
from bisect import bisect_right
from pathlib import Path

from mpi4py import MPI

from clusterkernel.comm import _check
from clusterkernel.comm._auto import adapt
from clusterkernel.comm._begin import step_entry
from clusterkernel.comm._errors import CommError
from clusterkernel.comm._groups import Group, resolve
from clusterkernel.comm._ledger import abandon
from clusterkernel.comm._ops import ALGORITHMS, FUSED_ALGORITHMS
from clusterkernel.comm._shm import alloc as shm_alloc

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
# faster than MPI from a smaller size on 2 ranks than on 4 (BENCHMARKS.md, "Collectives",
# shared buckets); this is the size where it wins on both, so from
# it auto sends such tensors to "shm" whatever the table.
ZERO_COPY_MIN = 1 << 19
SHIPPED = Path(__file__).with_name("auto_table.json")
ENV_ALGORITHM = "CLUSTERKERNEL_ALGORITHM"
ENV_TABLE = "CLUSTERKERNEL_AUTO_TABLE"
# The flight entry of a group's first-use set-up: "auto set-up for all_reduce" (the
# hang report, client side, knows this prefix: client/cluster/_hangreport.py)
SETUP_LABEL = "auto set-up for"


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


_UNREADABLE = (OSError, ValueError, KeyError, TypeError)  # what reading a table can raise


def read_rules(path: Path) -> list[dict]:
    """The rules of a table file (``{"rules": [...]}``); raises what reading raises."""
    return json.loads(Path(path).read_text())["rules"]


def _load_table() -> list[dict]:
    """This rank's table of rules, checked (a clear CommError names a bad file)."""
    path = os.environ.get(ENV_TABLE)
    if path:
        try:
            return _checked(read_rules(Path(path)), path)
        except _UNREADABLE as exc:
            raise CommError(
                f"{ENV_TABLE}={path} is not a readable table ({exc}); make one with "
                "comm.tune() or unset the variable"
            ) from None
    try:
        cached = json.loads(cache_path().read_text())
        rows = cached["machines"][machine_id()]["rules"]
    except _UNREADABLE:
        return _checked(read_rules(SHIPPED), "the shipped table")  # no cache for this machine
    return _checked(rows, str(cache_path()))


def _checked(rows: list[dict], source: str) -> list[dict]:
    for r in rows:
        try:
            limits, algs = list(r["limits"]), list(r["algs"])
            ok = r["op"] in CANDIDATES and int(r["nodes"]) >= 1 and int(r["ranks"]) >= 1
            ok = ok and len(algs) == len(limits) + 1 and limits == sorted(limits)
            ok = ok and all(a in ALGORITHMS for a in algs)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise CommError(
                f"{source}: a rule is malformed: {r!r}. A rule has op, nodes, ranks, "
                "sorted limits and one more algorithm than limits; remake it with comm.tune()"
            )
    return rows


def _forced() -> str | None:
    name = os.environ.get(ENV_ALGORITHM, "").strip().lower()
    if name in ("", "auto"):
        return None
    if name not in ALGORITHMS:
        raise CommError(
            f"{ENV_ALGORITHM}={name!r} is not an algorithm; use one of {ALGORITHMS} (or unset it)"
        )
    return name


def usable(op: str, nodes: int) -> tuple[str, ...]:
    """The algorithms ``op`` can run on a group spread over ``nodes`` nodes."""
    return tuple(
        a
        for a in CANDIDATES[op]
        if not (a == "shm" and nodes > 1) and not (a == "hier" and nodes == 1)
    )


def node_count(g: Group) -> int:
    """How many nodes (shared-memory domains, as shm and hier see them) ``g`` spans.

    Collective over ``g``.
    """
    inner = g.inner()
    local = inner.Split_type(MPI.COMM_TYPE_SHARED, key=g.rank)
    leader = local.Get_rank() == 0
    local.Free()
    return inner.allreduce(int(leader))


def rules_for(
    table: list[dict], nodes: int, size: int, forced: str | None = None, adapts: bool = False
) -> dict:
    """Per op ``(limits, algorithms)`` for a group of ``size`` ranks on ``nodes`` nodes,
    plus ``"forced"`` (the forced algorithm, or None), ``"nodes"`` and ``"adapt"``
    (whether large calls adapt: ``adapts`` unless an algorithm is forced).

    Takes the table's rule for the same node layout (one node, or several) with the
    nearest group size; an algorithm the layout cannot run (shared memory across
    nodes, the hierarchy on one node) becomes ``"mpi"``.
    """
    rules: dict = {"forced": forced, "nodes": nodes, "adapt": adapts and forced is None}
    for op in CANDIDATES:
        can = usable(op, nodes)
        if forced is not None and forced in can:
            rules[op] = ((), (forced,))
            continue
        rows = [r for r in table if r["op"] == op and (r["nodes"] > 1) == (nodes > 1)]
        if not rows:
            rules[op] = ((), ("mpi",))
            continue
        row = min(rows, key=lambda r: (abs(r["ranks"] - size), r["ranks"]))
        algs = tuple(a if a in can else "mpi" for a in row["algs"])
        rules[op] = (tuple(row["limits"]), algs)
    return rules


def setup(g: Group, name: str, nbytes: int = 0) -> dict:
    """The group's rules, made at its first ``auto`` call (collective over ``g``)."""
    # In the flight recorder under the number of the call it precedes: ranks left
    # waiting here (one rank never made the call) show in the hang report.
    what = f"{SETUP_LABEL} {name}"
    entry = step_entry(g, what, nbytes)
    try:
        rules = _setup(g, name)
    finally:
        abandon(entry)  # a step of the call it precedes: that call writes the record
    return rules


def _setup(g: Group, name: str) -> dict:
    # Every member must be making an auto call now: checked like any collective, so
    # a rank that called something else raises with the others instead of hanging.
    _check.verify(g, name, None, alg="auto")
    nodes = node_count(g)
    try:
        text = json.dumps([_load_table(), _forced(), adapt.enabled()], sort_keys=True)
        mine = (zlib.crc32(text.encode()), None)
    except CommError as exc:
        text, mine = "", (0, str(exc))
    inner = g.inner()
    everyone = inner.allgather(mine)
    errors = [f"rank {g.ranks[i]}: {e[1]}" for i, e in enumerate(everyone) if e[1]]
    if errors:
        raise CommError("algorithm='auto' cannot start:\n  " + "\n  ".join(errors))
    if any(e[0] != everyone[0][0] for e in everyone):  # different answers: group rank 0's
        text = inner.bcast(text if g.rank == 0 else None)
    table, forced, adapts = json.loads(text)
    rules = rules_for(table, nodes, g.size, forced, adapts)
    g._auto = rules
    return rules


def zero_copy(g: Group, tensor, nbytes: int) -> bool:
    """Whether ``auto`` runs ``"shm"`` for this call: a large tensor inside one of
    ``g``'s :func:`shm_empty` allocations (unless ``CLUSTERKERNEL_ALGORITHM`` forces an
    algorithm).

    Decided on each rank from its own tensor, so every rank must pass such a tensor:
    if only some do, the call waits and the hang report names it; check mode
    ``"every"`` names it before any data moves (the call's signature says "shm").
    Such calls run outside the size class's arm (:mod:`.adapt`).
    """
    seg = g._shm
    if nbytes >= ZERO_COPY_MIN and seg is not None and seg.arenas and not g._auto["forced"]:
        return tensor.is_contiguous() and shm_alloc.find(seg, tensor)[0] > 0
    return False


def choose(g: Group, name: str, nbytes: int) -> str:
    """The algorithm ``auto`` runs for call ``name`` of ``nbytes`` on ``g``."""
    rules = g._auto
    if rules is None:
        rules = setup(g, name, nbytes)
    limits, algs = rules[RULE_OF[name]]
    alg = algs[bisect_right(limits, nbytes)]
    if name == "all_reduce_coalesced" and alg not in FUSED_ALGORITHMS:
        return "mpi"  # buckets have no hierarchy (yet)
    return alg


def adaptive(g: Group, name: str, nbytes: int):
    """The :class:`~.adapt.Arm` of an ``auto`` call ``name`` of ``nbytes`` on ``g``, or
    None where the call keeps the table's choice (small, one candidate, forced)."""
    rules = g._auto
    if rules is None:
        rules = setup(g, name, nbytes)
    if not rules["adapt"] or nbytes < adapt.ADAPT_MIN:  # agreed at set-up: every member
        return None
    algs = usable(RULE_OF[name], rules["nodes"])
    if name == "all_reduce_coalesced":
        algs = tuple(a for a in algs if a in FUSED_ALGORITHMS)
    return adapt.arm(g, name, nbytes, algs, choose(g, name, nbytes))


def pick(g: Group, name: str, tensor, nbytes: int) -> str:
    """:func:`choose` for a call on ``tensor``: MPI for tensors not in CPU memory
    (shared memory, the ring and the hierarchy move host memory only)."""
    return choose(g, name, nbytes) if tensor.is_cpu else "mpi"


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
