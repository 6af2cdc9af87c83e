"""torch.distributed around a cluster's ranks (client side).

At every start and restart each rank gets torchrun's environment
(``clusterkernel.torchdist.torchrun_env``, one MPI allgather and broadcast) and,
with ``Cluster(torch=True)``, the default process group; before ranks stop their
groups are destroyed; ``torch_reinit`` makes a new group in the live ranks. The
rank-side functions are called by name (``clusterkernel.protocol._rank_call``): the notebook
never imports torch.distributed for this. :func:`torch_group` and :func:`torch_reinit` are
``Cluster``'s methods of those names (they read the cluster through its public API).

Example::

    ranks_up(cluster, backend=None)     # env + the group, torch's own pick of backend
    ranks_up(cluster, backend=False)    # env only
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import ipyparallel as ipp

from clusterkernel.client.errors import ClusterError, format_ranks, rank_error_lines
from clusterkernel.protocol import _targets
from clusterkernel.protocol._names import GPU_REQUEST, PREIMPORT
from clusterkernel.protocol._rank_call import rank_call

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster

BACKENDS = ("gloo", "nccl")  # what --backend takes (torchdist._group.BACKENDS on the ranks)

# torch's flight recorder on for every rank (read by the hang report), unless the
# user set a size; NCCL's per-collective timing for the dashboard.
_TORCH_ENV = {"TORCH_FR_BUFFER_SIZE": "200", "TORCH_NCCL_ENABLE_TIMING": "1"}
# Seconds: rendezvous of a new group. torch's own default waits 30 minutes for a
# rank that never comes; a start should fail long before that.
_INIT_TIMEOUT = 120.0


def check_backend_name(backend: str | None) -> None:
    if backend is not None and backend not in BACKENDS:
        raise ValueError(
            f"backend {backend!r}: use {' or '.join(BACKENDS)}, or leave it out for "
            "torch's pick by device (gloo on CPU, nccl on GPUs)."
        )


def engine_env(env: dict[str, str], group: bool = False) -> dict[str, str]:
    """The ranks' environment: the user's, plus what clusterkernel needs set at launch.

    Each engine imports what a first cell needs while it registers (``rank/_warm_start.py``):
    clusterkernel.comm (torch, MPI), and torch.distributed where ``group`` (``--torch``:
    the ranks get a default group at start). ``env`` may name others, or ``""`` for none.
    """
    out = dict(env)
    out.setdefault(PREIMPORT, "clusterkernel.comm" + (",torch.distributed" if group else ""))
    # Figures made on a rank are sent to the notebook when shown.
    out.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    for key, value in _TORCH_ENV.items():
        out.setdefault(key, value)
    return out


def _call_all(cluster: Cluster, what: str, target: str, *args, timeout: float) -> dict[int, Any]:
    """``rank_call(target, *args)`` on every rank: ``{rank: result}``; a clear error per rank."""
    ranks = cluster.ranks
    ar = cluster.view(ranks).apply_async(rank_call, target, *args)
    try:
        return dict(zip(ranks, ar.get(timeout=timeout)))
    except ipp.error.TimeoutError:
        raise ClusterError(f"{what} did not finish within {timeout:.0f}s on every rank.") from None
    except ipp.error.CompositeError as e:
        errors = []
        for ename, evalue, _tb, info in e.elist:
            try:
                rank = cluster.rank_of((info or {}).get("engine_id"))
            except KeyError:
                rank = -1
            errors.append((rank, ename, evalue))
        said = "\n".join(f"  {line}" for line in rank_error_lines(errors))
        raise ClusterError(f"{what} failed:\n{said}") from None


def ranks_up(cluster: Cluster, backend: str | None | bool) -> dict[int, list[int]]:
    """torchrun's environment on every rank, its GPU (where the host has GPUs, or as
    ``cluster.gpus_per_rank`` says); then the default group unless ``backend`` is
    False (None: torch picks the backend). Returns each bound rank's GPUs."""
    bound = _call_all(
        cluster,
        "Setting torchrun's environment and each rank's GPU",
        _targets.TORCH_PREPARE_RANK,
        cluster.gpus_per_rank,
        cluster.gpu_share,
        timeout=120,
    )
    gpus = {rank: b["devices"] for rank, b in bound.items() if b}
    if backend is not False:
        _call_all(
            cluster,
            "Making the torch.distributed process group (--torch)",
            _targets.TORCH_INIT,
            backend,
            _INIT_TIMEOUT,
            timeout=_INIT_TIMEOUT + 10,
        )
    return gpus


def gpu_status(cluster: Cluster) -> dict[int, dict | None]:
    """Each rank's GPU (name, memory, utilisation), asked on the control channel so a
    busy rank answers; ranks that did not answer are missing."""
    from clusterkernel.client.cluster._ipp import control_request

    engines = {r: cluster.engine_id(r) for r in cluster.live_ranks}
    replies = control_request(cluster.client, engines, GPU_REQUEST, {}, timeout=3.0)
    return {r: c.get("gpu") for r, c in replies.items() if c.get("status") == "ok"}


def ranks_going_down(cluster: Cluster, timeout: float = 5.0) -> None:
    """Destroy the torch.distributed groups of the idle ranks before they stop.

    Best effort: busy ranks (a cell still running, a rank stuck) are left to the
    stop; an idle rank without torch.distributed answers at once.
    """
    try:
        client = cluster.client
        queue = client.queue_status()
    except Exception:  # the controller may be gone
        return
    engines = cluster.engine_of.values()
    idle = [eid for eid in engines if (queue.get(eid) or {}).get("queue", 1) == 0]
    if not idle:
        return
    try:
        client[idle].apply_async(rank_call, _targets.TORCH_DESTROY).get(timeout=timeout)
    except Exception:  # a rank that cannot destroy its group is stopped all the same
        pass


def torch_group(cluster: Cluster) -> dict[int, dict]:
    """Each rank's default torch.distributed group: ``{rank: {"backend", "rank",
    "world_size", "master"}}`` (empty dicts where a rank has none)."""
    cluster.require_running()
    return _call_all(
        cluster,
        "Reading the torch.distributed group",
        _targets.TORCH_DESCRIBE,
        timeout=30,
    )


def torch_reinit(cluster: Cluster, backend: str | None = None) -> dict[int, dict]:
    """A new default torch.distributed group in the live ranks, their variables kept.

    Destroys what is left of the old group (or an aborted one), gives rank 0 a
    fresh port, and makes the group again (``backend``: default the last one), and
    the subgroups made with ``dist.new_group`` on it, the names holding them rebound.
    Models wrapped in DDP/FSDP hold the old group: wrap them again. Returns each
    rank's group (``{rank: {"backend": "gloo", "world_size": 4, ..., "subgroups":
    ["g"]}}``).

    Example::

        cluster.torch_reinit()      # %mpi torch-reinit
    """
    check_backend_name(backend)
    cluster.require_running()
    return _call_all(
        cluster,
        "Re-making the torch.distributed process group",
        _targets.TORCH_REINIT,
        backend,
        _INIT_TIMEOUT,
        timeout=_INIT_TIMEOUT + 10,
    )


def subgroups_note(names: Iterable[str]) -> str:
    """What a report says of the user's subgroups made again on a new default group
    (a respawn, ``torch_reinit``: each rank's ``"subgroups"``), or ``""`` for none.

    Example::

        from clusterkernel.client.cluster import subgroups_note
        subgroups_note(["h", "g"])   # '; torch.distributed subgroup(s) g, h made again'
    """
    made = sorted(set(names))
    return f"; torch.distributed subgroup(s) {', '.join(made)} made again" if made else ""


def aborted_note(cluster: Cluster, aborted: list[int], stuck: list[int]) -> str:
    """What the hang report says after closing the ranks' torch.distributed groups;
    with ``Cluster(torch=True)`` and every rank free, a new group is made here and the
    DDP/FSDP models that hold the old one are named with the line that wraps them again."""
    if stuck:  # the restart that follows makes new ranks (and groups)
        return (
            f"Closing the torch.distributed connections of ranks {format_ranks(aborted)} "
            f"did not free rank {format_ranks(stuck)}."
        )
    head = (
        f"Ranks {format_ranks(aborted)}: their torch.distributed connections were closed "
        "to free the ranks blocked in a collective; their variables, models and optimizers "
        "are kept."
    )
    if not cluster.torch:
        return (
            f"{head} Run %mpi torch-reinit (cluster.torch_reinit()) for a new default group, "
            "then wrap DDP models again: model = torchdist.rewrap(model)."
        )
    try:
        groups = cluster.torch_reinit()
    except ClusterError as e:
        return f"{head}\nMaking a new default group failed: {e}"
    made = subgroups_note(n for g in groups.values() for n in g.get("subgroups", ()))
    return f"{head} A new default group is made (as %mpi torch-reinit does){made}.{_held(cluster)}"


def _held(cluster: Cluster) -> str:
    """The models that still hold the closed group, and how to wrap them again."""
    try:
        held = _call_all(
            cluster,
            "Finding the models that hold the old group",
            _targets.TORCH_HELD_MODELS,
            timeout=30,
        )
    except ClusterError:
        return " Wrap DDP models again: model = torchdist.rewrap(model)."
    ddp = sorted({n for h in held.values() for n in h["ddp"]})
    fsdp = sorted({n for h in held.values() for n in h["fsdp"]})
    out = ""
    if ddp:
        lines = "; ".join(f"{n} = torchdist.rewrap({n})" for n in ddp)
        out += (
            f"\nDDP models hold the closed group: run {lines} in a %%mpi cell (from "
            "clusterkernel import torchdist); their parameters and optimizers stay."
        )
    kept = sorted({n for h in held.values() for n in h.get("kept", [])})
    if fsdp:
        out += (
            f"\nFSDP models hold the closed group: {', '.join(fsdp)}; their shards are "
            "kept on every rank; save each rank's state_dict() and shard the model again "
            "(a torchdist.Keeper does it)."
        )
    if kept:
        runs = "; ".join(f"{n}.restore()" for n in kept)
        out += f"\nRun {runs} in a %%mpi cell: the model is made again on the new group from its last save."
    return out


_TWICE = "trying to initialize the default process group twice"


def error_hint(summaries: list[str], made_by_start: bool) -> str:
    """A note for errors a torch.distributed user meets in a notebook, or ``""``."""
    if any(_TWICE in s for s in summaries):
        who = "%mpi start --torch made it" if made_by_start else "an earlier cell made it"
        return (
            f"The ranks already have a default process group ({who}): use it as it is "
            "(dist.is_initialized() is True), or run %mpi torch-reinit for a new one."
        )
    return ""
