"""Helpers for collectives that take lists of tensors: validation, packing, unpacking."""

from __future__ import annotations

import torch

from clusterkernel.comm._dtypes import DType, dtype_of


def check_list(tensors: object, n: int, like: torch.Tensor, what: str) -> list[torch.Tensor]:
    """``tensors`` must be a list of ``n`` tensors with ``like``'s shape and dtype."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{what} must be a list of {n} tensors, got {type(tensors).__name__}")
    if len(tensors) != n:
        raise ValueError(
            f"{what} has {len(tensors)} tensors; it needs one per rank of the group ({n})"
        )
    for i, t in enumerate(tensors):
        dtype_of(t, f"{what}[{i}]")
        if t.shape != like.shape or t.dtype != like.dtype:
            raise ValueError(
                f"{what}[{i}] is {t.dtype}{list(t.shape)} but the tensor is "
                f"{like.dtype}{list(like.shape)}; all must match"
            )
    return list(tensors)


def pack(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """Stack tensors into one contiguous host buffer (casting, e.g. halves to float32)."""
    first = tensors[0]
    out = torch.empty((len(tensors), *first.shape), dtype=dtype)
    for row, t in zip(out, tensors):
        row.copy_(t.detach())
    return out


def unpack(packed: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    for row, t in zip(packed, tensors):
        t.detach().copy_(row)


def root_only(value: object, what: str, root_name: str) -> None:
    if value:
        raise ValueError(f"{what} must be given only on the {root_name} rank; pass None here")


def root_list(
    tensors: object, on_root: bool, n: int, like: torch.Tensor, what: str, root_name: str, root: int
) -> list[torch.Tensor] | None:
    """A rooted call's list (``what``: ``scatter_list``, ``gather_list``): on the root
    (rank ``root``, the call's ``root_name`` argument) one tensor per rank like
    ``like``, checked; elsewhere None, and it must not be given."""
    if not on_root:
        root_only(tensors, what, root_name)
        return None
    if tensors is None:
        call = what.removesuffix("_list")
        raise ValueError(f"{call} on {root_name} rank {root} needs {what} (one tensor per rank)")
    return check_list(tensors, n, like, what)


def same_dtype(output: torch.Tensor, input: torch.Tensor, what: str) -> DType:
    info = dtype_of(output, "output")
    dtype_of(input, "input")
    if output.dtype != input.dtype:
        raise ValueError(
            f"{what}: output is {output.dtype} but input is {input.dtype}; they must match"
        )
    return info
