"""A model's trainable parameters seen as one flat vector, and that vector's shards.

Parameter servers, EASGD and gossip move whole models (or contiguous pieces of
them) in single messages, so they work on one flat copy instead of a tensor per
layer.
"""

from __future__ import annotations

import torch
from torch import nn


def shard_ranges(numel: int, shards: int) -> list[tuple[int, int]]:
    """Split ``range(numel)`` into ``shards`` contiguous ranges of near-equal size.

    Equal element counts give every server the same bytes to receive and the
    same update work, whatever the layer sizes are.

    Example: ``shard_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]``
    """
    if shards < 1:
        raise ValueError(f"need at least one shard, got {shards}")
    if numel < shards:
        raise ValueError(
            f"cannot split {numel} parameters over {shards} servers; use at most {numel} servers"
        )
    base, extra = divmod(numel, shards)
    out, lo = [], 0
    for i in range(shards):
        hi = lo + base + (i < extra)
        out.append((lo, hi))
        lo = hi
    return out


class FlatParams:
    """The trainable parameters of ``model`` read and written as one flat vector.

    All of them must share one dtype (the messages carry one dtype).

    Example::

        flat = FlatParams(model)
        v = flat.read()            # a new 1-D tensor of all parameters
        flat.write(v * 0.5)        # back into the model
        g = flat.read_grads()      # gradients, zeros where a parameter has none
    """

    def __init__(self, model: nn.Module):
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        dtypes = sorted({str(p.dtype) for p in self.params})
        if len(dtypes) > 1:
            raise ValueError(
                f"all trainable parameters must share one dtype, got {dtypes}; convert the "
                "model first, e.g. model.float()"
            )
        self.dtype = self.params[0].dtype
        if not self.dtype.is_floating_point:
            raise ValueError(f"parameters must be floating point, got {self.dtype}")
        self.numel = sum(p.numel() for p in self.params)
        self._offsets = []
        lo = 0
        for p in self.params:
            self._offsets.append(lo)
            lo += p.numel()

    def empty(self) -> torch.Tensor:
        """A new uninitialised flat vector of the right size and dtype."""
        return torch.empty(self.numel, dtype=self.dtype)

    @torch.no_grad()
    def read(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The parameters, copied into ``out`` (or a new vector)."""
        out = self.empty() if out is None else out
        for p, lo in zip(self.params, self._offsets):
            out[lo : lo + p.numel()].copy_(p.reshape(-1))
        return out

    @torch.no_grad()
    def read_grads(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The gradients, copied into ``out`` (or a new vector); zeros where none."""
        out = self.empty() if out is None else out
        for p, lo in zip(self.params, self._offsets):
            piece = out[lo : lo + p.numel()]
            if p.grad is None:
                piece.zero_()
            else:
                piece.copy_(p.grad.reshape(-1))
        return out

    @torch.no_grad()
    def write(self, values: torch.Tensor, start: int = 0) -> None:
        """Copy ``values`` into the parameters at flat positions ``start, start+1, ...``."""
        end = start + values.numel()
        for p, lo in zip(self.params, self._offsets):
            hi = lo + p.numel()
            if hi <= start or lo >= end:
                continue
            a, b = max(lo, start), min(hi, end)
            p.view(-1)[a - lo : b - lo].copy_(values[a - start : b - start])
