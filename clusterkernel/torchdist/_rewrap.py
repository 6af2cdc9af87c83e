"""Wrap a DDP model again on a new process group, same parameters (rank side).

After a hang was freed (``torchdist.abort``) and a new default group made (``%mpi
torch-reinit``, automatic with ``--torch``), a ``DistributedDataParallel`` model still
holds the old, closed group. :func:`rewrap` builds a new DDP around the same module
(the same ``Parameter`` objects, so optimizers made on it keep working) with the same
settings, on the new group; like DDP's own constructor it is collective and
broadcasts rank 0's parameters and buffers, so ranks that a hang left one step apart
agree again.

Example (a ``%%mpi`` cell after the hang report)::

    from clusterkernel import torchdist
    ddp = torchdist.rewrap(ddp)          # opt = SGD(ddp.parameters()) still works
"""

from __future__ import annotations

import inspect

from clusterkernel.protocol._engine import user_namespace as _user_namespace
from clusterkernel.protocol._engine import world
from clusterkernel.torchdist import _subgroups

# DDP's settings that its constructor takes under the same name as its attribute
_SAME_NAME = (
    "device_ids",
    "output_device",
    "dim",
    "find_unused_parameters",
    "gradient_as_bucket_view",
    "static_graph",
    "mixed_precision",
    "skip_all_reduce_unused_params",
)


def rewrap(model, process_group=None):
    """A new ``DistributedDataParallel`` around ``model.module``, same settings, on
    ``process_group`` (default: the subgroup made again in place of the one ``model``
    held, as ``%mpi torch-reinit`` and a respawn make them, else the current default
    group). Collective.

    ``model`` is a DDP model made before the group it holds was aborted. Comm hooks
    registered on the old wrapper are not carried over: register them again.
    An FSDP2 (``fully_shard``) model cannot be moved in place: raises ``TypeError``
    naming :class:`clusterkernel.torchdist.Keeper`, which rebuilds one on a new group.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not isinstance(model, DDP):
        kind = type(model).__name__
        if hasattr(model, "_get_fsdp_state"):
            raise TypeError(
                f"rewrap: {kind} is an FSDP2 (fully_shard) model; it cannot be moved onto "
                "a new group in place. Make it with keep = torchdist.Keeper(build) (build: "
                "a function returning (model, optimizer)) and keep.save(step) as it trains; "
                "keep.restore() rebuilds it on the new group from the last save (a respawn "
                "does it for you)."
            )
        raise TypeError(
            f"rewrap: expected a DistributedDataParallel model, got {kind}; a plain "
            "module needs no new group (wrap it: DDP(module))."
        )
    if process_group is None:
        process_group = _subgroups.again(model.process_group)
    return DDP(model.module, process_group=process_group, **_settings(model))


def _settings(model) -> dict:
    """The constructor arguments that made DDP ``model`` (those it keeps)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    takes = inspect.signature(DDP.__init__).parameters
    kwargs = {name: getattr(model, name) for name in _SAME_NAME if hasattr(model, name)}
    if not getattr(model, "bucket_bytes_cap_default", True):
        kwargs["bucket_cap_mb"] = model.bucket_bytes_cap / 2**20
    return {k: v for k, v in kwargs.items() if k in takes}


class Unwrapped:
    """A DDP model as a respawned rank receives it in its copy of a survivor's
    variables: the module (shared with the copy's other names) and DDP's settings;
    :func:`rewrap_namespace` wraps it on the new group."""

    def __init__(self, module, settings: dict) -> None:
        self.module = module
        self.settings = settings


def for_copy(value):
    """What a respawn's copy sends for ``value``: an :class:`Unwrapped` for a DDP model
    (DDP itself pickles only while it holds the current default group), a stand-in for
    a torch.distributed group (``_subgroups.for_copy``: made again after the copy),
    else ``value``."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if isinstance(value, DDP):
        return Unwrapped(value.module, _settings(value))
    return _subgroups.for_copy(value)


def rewrap_namespace(namespace: dict | None = None) -> dict[str, list[str]]:
    """After a respawn, on every rank, once the new default group is made: the user's
    subgroups made again and the names that held them rebound
    (:func:`clusterkernel.torchdist._subgroups.remake`), then the DDP models of the
    namespace that every rank has (by name; a respawned rank's :class:`Unwrapped`)
    wrapped again, each on the new group of the one it held (the default group, or a
    subgroup made again), in name order. Collective over the world. Returns
    ``{"groups": names rebound to a subgroup, "ddp": DDP models wrapped again}``."""
    import sys

    ns = _user_namespace() if namespace is None else namespace
    mine: list[str] = []
    dist = sys.modules.get("torch.distributed")
    live = dist is not None and dist.is_available() and dist.is_initialized()
    groups = _subgroups.remake(ns, live)
    if live:
        from torch.nn.parallel import DistributedDataParallel as DDP

        mine = sorted(
            n for n, v in ns.items() if not n.startswith("_") and isinstance(v, (DDP, Unwrapped))
        )
    common = sorted(set.intersection(*map(set, world().allgather(mine))))
    for name in common:
        value, group = ns[name], groups["ddp"].get(name)
        if isinstance(value, Unwrapped):
            from torch.nn.parallel import DistributedDataParallel as DDP

            ns[name] = DDP(value.module, process_group=group, **value.settings)
        else:
            ns[name] = rewrap(value, group)
    return {"groups": groups["names"], "ddp": common}


def held_models(namespace: dict | None = None) -> dict[str, list[str]]:
    """The names in ``namespace`` (default: the engine's user namespace, else
    ``__main__``) of models that hold a torch.distributed group:
    ``{"ddp": [...], "fsdp": [...], "kept": [...]}`` (``kept``: the
    :class:`~clusterkernel.torchdist.Keeper` objects, which rebuild theirs). What the
    hang report names after an abort.
    """
    if namespace is None:
        namespace = _user_namespace()
    from torch.nn.parallel import DistributedDataParallel as DDP

    from clusterkernel.torchdist._keep import Keeper

    found: dict[str, list[str]] = {"ddp": [], "fsdp": [], "kept": []}
    for name, value in list(namespace.items()):
        if name.startswith("_"):
            continue
        if isinstance(value, Keeper):
            found["kept"].append(name)
        elif isinstance(value, DDP):
            found["ddp"].append(name)
        elif hasattr(value, "_get_fsdp_state") and callable(value._get_fsdp_state):
            found["fsdp"].append(name)
    return found
