"""Replica consistency: copy rank 0's state everywhere, average gradients, check shapes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from clusterkernel import comm
from clusterkernel.protocol._errors import ClusterkernelError


class ReplicaMismatchError(ClusterkernelError, ValueError):
    """The model or optimizer is not the same on every rank.

    Raised on every rank alike (see :func:`check_replicas`), naming the ranks that
    differ from rank 0 and the first difference: a parameter's name, shape and
    dtype, a parameter count, or the optimizer's type or shapes.
    """


def all_objects(obj: Any, group: comm.Group | None = None) -> list:
    """Every rank's ``obj``, in group rank order, on every rank."""
    out = [None] * comm.size(group)
    comm.all_gather_object(out, obj, group=group)
    return out


def world_rank(group: comm.Group | None, r: int) -> int:
    """World rank of rank ``r`` of ``group``: comm's ``src``/``dst`` are world ranks."""
    return r if group is None else group.ranks[r]


def _flat_groups(tensors: Iterable[torch.Tensor]) -> dict[torch.dtype, list[torch.Tensor]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
    for t in tensors:
        groups[t.dtype].append(t)
    return groups


@torch.no_grad()
def broadcast_tensors(
    tensors: Iterable[torch.Tensor], src: int = 0, group: comm.Group | None = None
) -> None:
    """Overwrite ``tensors`` with ``src``'s values, one broadcast per dtype.

    Flattening first turns many small broadcasts into one, which matters for
    models with many small layers.

    Example::

        broadcast_tensors([*model.parameters(), *model.buffers()], src=0)
    """
    for ts in _flat_groups(tensors).values():
        flat = torch.cat([t.detach().reshape(-1) for t in ts])
        comm.broadcast(flat, src, group=group)
        offset = 0
        for t in ts:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n


def sync_parameters(model: nn.Module, src: int = 0, group: comm.Group | None = None) -> None:
    """Give every rank ``src``'s parameters and buffers (a broadcast).

    Example::

        torch.manual_seed(comm.rank())     # ranks start different ...
        model = Net()
        sync_parameters(model)             # ... and now all hold rank 0's weights
    """
    broadcast_tensors([*model.parameters(), *model.buffers()], src, group)


@torch.no_grad()
def average_gradients(model: nn.Module, group: comm.Group | None = None) -> None:
    """Average ``.grad`` over ranks, one ``all_reduce`` per parameter (for teaching).

    This is the PyTorch tutorial's version: simple and correct, but it sends one
    message per parameter and waits for each. :class:`DataParallel` does the same
    job with fused buckets that overlap the backward pass. A parameter without a
    gradient counts as zeros, so every rank issues the same collectives.

    Example::

        loss.backward()
        average_gradients(model)
        optimizer.step()
    """
    world = comm.size(group)
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        comm.all_reduce(p.grad, op=comm.SUM, group=group)
        p.grad.div_(world)


def _signature(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    params = [(n, tuple(p.shape), str(p.dtype)) for n, p in model.named_parameters()]
    buffers = [(n, tuple(b.shape), str(b.dtype)) for n, b in model.named_buffers()]
    sig: dict = {"params": params, "buffers": buffers}
    if optimizer is not None:
        owned = {id(p) for p in model.parameters()}
        sig["optimizer"] = {
            "type": type(optimizer).__name__,
            "groups": [[tuple(p.shape) for p in g["params"]] for g in optimizer.param_groups],
            "foreign": sum(id(p) not in owned for g in optimizer.param_groups for p in g["params"]),
        }
    return sig


def _describe(ref: list, mine: list, what: str) -> str:
    if len(ref) != len(mine):
        return f"{len(mine)} {what} (rank 0 has {len(ref)})"
    for a, b in zip(ref, mine):
        if a != b:
            return f"{what[:-1]} {b} where rank 0 has {a}"
    return f"different {what}"


def _optimizer_diff(ref: dict | None, mine: dict | None) -> str:
    if ref is None or mine is None:
        return (
            f"optimizer {'given' if mine else 'missing'} (rank 0: {'given' if ref else 'missing'})"
        )
    if mine["type"] != ref["type"]:
        return f"{mine['type']} (rank 0 has {ref['type']})"
    if len(mine["groups"]) != len(ref["groups"]):
        return f"{len(mine['groups'])} parameter groups (rank 0 has {len(ref['groups'])})"
    flat_mine = [s for g in mine["groups"] for s in g]
    flat_ref = [s for g in ref["groups"] for s in g]
    return _describe(flat_ref, flat_mine, "parameter shapes")


def check_replicas(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    group: comm.Group | None = None,
) -> None:
    """Raise :class:`ReplicaMismatchError` on every rank unless all ranks agree.

    Compares parameter and buffer names, shapes and dtypes, and (if given) the
    optimizer's type and the shapes in each parameter group, against rank 0. The
    error names the ranks that differ. All ranks gather all signatures and decide
    together, so either every rank raises or none does: no rank is left waiting.

    Example::

        check_replicas(model, optimizer)   # before the first collective on them
    """
    sigs = all_objects(_signature(model, optimizer), group)
    foreign = [r for r, s in enumerate(sigs) if s.get("optimizer", {}).get("foreign")]
    if foreign:
        counts = ", ".join(f"rank {r}: {sigs[r]['optimizer']['foreign']}" for r in foreign)
        raise ReplicaMismatchError(
            f"the optimizer holds parameters that are not in the model ({counts}). Build "
            "the optimizer from this model's parameters()."
        )
    ref = sigs[0]
    problems = []
    for r, sig in enumerate(sigs[1:], start=1):
        before = len(problems)
        for key, what in (("params", "parameters"), ("buffers", "buffers")):
            if sig[key] != ref[key]:
                problems.append((r, "model", _describe(ref[key], sig[key], what)))
        if len(problems) == before and sig.get("optimizer") != ref.get("optimizer"):
            # (a model mismatch already explains a mismatch in the optimizer's shapes)
            problems.append(
                (r, "optimizer", _optimizer_diff(ref.get("optimizer"), sig.get("optimizer")))
            )
    if problems:
        ranks = sorted({r for r, _, _ in problems})
        lines = "; ".join(f"rank {r} {kind}: {detail}" for r, kind, detail in problems)
        raise ReplicaMismatchError(
            f"model/optimizer differ across ranks; ranks {ranks} do not match rank 0: "
            f"{lines}. Build the same model (and optimizer) on every rank; use the same "
            "code and arguments, and seed only the initial weights differently if at all."
        )
