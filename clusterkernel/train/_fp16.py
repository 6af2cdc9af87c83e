"""Float16 compression of gradients, the one definition its users share.

DataParallel's :func:`~clusterkernel.train.comm_hooks.fp16_compress_wrapper` and
the parameter server's gradient codec both send gradients as float16: half the
bytes of float32, about 1e-3 relative precision, and magnitudes above 65504
overflow to infinity.
"""

from __future__ import annotations

import torch

WIRE_DTYPE = torch.float16


def nbytes(numel: int) -> int:
    """Bytes of ``numel`` compressed values."""
    return 2 * numel


def compress(src: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``src`` rounded to float16, into ``out`` (a float16 tensor) if given.

    Example::

        half = compress(grad)          # a new float16 tensor
        decompress(half, grad)         # back into the float32 gradient
    """
    if out is None:
        return src.to(WIRE_DTYPE)
    if out.dtype != WIRE_DTYPE:
        raise TypeError(f"compress writes float16, got an out tensor of {out.dtype}")
    return out.copy_(src)


def decompress(src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The float16 values ``src`` in ``out``'s dtype, written into ``out``."""
    return out.copy_(src)
