"""Gradient compression on the wire: none, float16, or top-k with error feedback."""

from __future__ import annotations

import math

import numpy as np
import torch

from clusterkernel.train import _fp16

COMPRESSIONS = (None, "fp16", "topk")


def _align8(n: int) -> int:
    return (n + 7) & ~7


def _view(buf: np.ndarray, start: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """``count`` elements of ``dtype`` at byte ``start`` of ``buf`` (no copy)."""
    size = torch.empty((), dtype=dtype).element_size()
    return torch.from_numpy(buf[start : start + count * size]).view(dtype)


class GradientCodec:
    """Encodes one shard of ``numel`` gradient values into bytes and back.

    - ``None``: the values as they are;
    - ``"fp16"``: values as float16 (:mod:`~clusterkernel.train._fp16`: half the
      bytes; magnitudes above 65504 overflow);
    - ``"topk"``: only the ``ratio * numel`` largest-magnitude values and their
      indices. What is left out is kept in a residual and added to the next
      gradient (error feedback), so every gradient component is sent eventually.

    The sender keeps the residual, so each worker needs its own codec per shard.

    Example::

        codec = GradientCodec("topk", numel=1000, dtype=torch.float32, ratio=0.05)
        buf = np.empty(codec.max_bytes, np.uint8)
        n = codec.encode(grad, buf)                 # 50 indices + 50 values
        dense = codec.decode(buf[:n], torch.empty(1000))
    """

    def __init__(
        self, kind: str | None, numel: int, dtype: torch.dtype, ratio: float = 0.01
    ) -> None:
        if kind not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {kind!r}")
        if kind == "topk" and not (isinstance(ratio, float | int) and 0 < ratio <= 1):
            raise ValueError(f"topk_ratio must be in (0, 1], got {ratio!r}")
        self.kind = kind
        self.numel = numel
        self.dtype = dtype
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        self.k = max(1, math.ceil(ratio * numel)) if kind == "topk" else numel
        self.residual: torch.Tensor | None = None
        if kind == "topk":
            self.max_bytes = _align8(4 * self.k) + self.k * self.itemsize
        elif kind == "fp16":
            self.max_bytes = _fp16.nbytes(numel)
        else:
            self.max_bytes = numel * self.itemsize

    def encode(self, grad: torch.Tensor, out: np.ndarray) -> int:
        """Write ``grad`` (1-D, ``numel`` values) into ``out``; returns bytes used."""
        if self.kind == "fp16":
            _fp16.compress(grad, _view(out, 0, self.numel, _fp16.WIRE_DTYPE))
        elif self.kind == "topk":
            if self.residual is None:
                self.residual = torch.zeros(self.numel, dtype=self.dtype)
            full = self.residual.add_(grad)
            idx = full.abs().topk(self.k, sorted=False).indices
            _view(out, 0, self.k, torch.int32).copy_(idx)
            _view(out, _align8(4 * self.k), self.k, self.dtype).copy_(full[idx])
            full[idx] = 0  # sent: what stays is the error fed back next time
        else:
            _view(out, 0, self.numel, self.dtype).copy_(grad)
        return self.max_bytes

    def decode(self, payload: np.ndarray, out: torch.Tensor) -> torch.Tensor:
        """The dense gradient from ``payload`` (exactly what :meth:`encode` wrote)."""
        if payload.nbytes != self.max_bytes:
            raise ValueError(
                f"gradient message has {payload.nbytes} bytes, expected {self.max_bytes}: "
                "workers and servers disagree on the model or the compression"
            )
        if self.kind == "fp16":
            _fp16.decompress(_view(payload, 0, self.numel, _fp16.WIRE_DTYPE), out)
        elif self.kind == "topk":
            idx = _view(payload, 0, self.k, torch.int32).long()
            out.zero_()
            out[idx] = _view(payload, _align8(4 * self.k), self.k, self.dtype)
        else:
            out.copy_(_view(payload, 0, self.numel, self.dtype))
        return out
