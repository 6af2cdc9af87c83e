"""Torch dtypes on the wire: MPI datatype, element kind, and the host buffer of a tensor.

CPU tensors are passed to MPI as a raw buffer over their own memory (zero copy,
never pickle). A tensor is *staged* through a contiguous host copy only when it
has to be: it is not contiguous, it lives on a device and MPI is not CUDA-aware,
or it is float16/bfloat16 and is being reduced (MPI has no half types, so those
reduce in float32 and are cast back, which is also more accurate).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import NamedTuple

import numpy as np
import torch
from mpi4py import MPI

from clusterkernel.comm._gate import changed
from clusterkernel.comm._hugepages import THRESHOLD as HUGE_THRESHOLD
from clusterkernel.comm._hugepages import note_buffer

_fromaddress = MPI.buffer.fromaddress


class DType(NamedTuple):
    mpi: MPI.Datatype
    kind: str  # f float, h half (float16/bfloat16), i integer, b bool, c complex
    np: type | None  # numpy dtype for local arithmetic (None for halves)
    itemsize: int


DTYPES: dict[torch.dtype, DType] = {
    torch.float32: DType(MPI.FLOAT, "f", np.float32, 4),
    torch.float64: DType(MPI.DOUBLE, "f", np.float64, 8),
    # Halves travel as raw 16-bit words; reductions stage them to float32.
    torch.float16: DType(MPI.UINT16_T, "h", None, 2),
    torch.bfloat16: DType(MPI.UINT16_T, "h", None, 2),
    torch.int8: DType(MPI.INT8_T, "i", np.int8, 1),
    torch.uint8: DType(MPI.UINT8_T, "i", np.uint8, 1),
    torch.int16: DType(MPI.INT16_T, "i", np.int16, 2),
    torch.int32: DType(MPI.INT32_T, "i", np.int32, 4),
    torch.int64: DType(MPI.INT64_T, "i", np.int64, 8),
    torch.uint16: DType(MPI.UINT16_T, "i", np.uint16, 2),
    torch.uint32: DType(MPI.UINT32_T, "i", np.uint32, 4),
    torch.uint64: DType(MPI.UINT64_T, "i", np.uint64, 8),
    torch.bool: DType(MPI.C_BOOL, "b", np.bool_, 1),
    torch.complex64: DType(MPI.C_FLOAT_COMPLEX, "c", np.complex64, 8),
    torch.complex128: DType(MPI.C_DOUBLE_COMPLEX, "c", np.complex128, 16),
}
F32 = DTYPES[torch.float32]


def reduced(info: DType) -> DType:
    """The dtype a reduction of ``info``'s tensors runs in (the rule, written once):
    halves reduce in float32; every other dtype as it is."""
    return F32 if info.kind == "h" else info


def reduced_torch(dtype: torch.dtype) -> torch.dtype:
    """:func:`reduced` for a torch dtype: ``torch.float32`` for halves."""
    return torch.float32 if DTYPES[dtype].kind == "h" else dtype


def direct(info: DType, cpu: bool) -> bool:
    """Whether a reduction may let MPI work on a tensor's own memory (when it is
    contiguous; the rule's plan part, :func:`~._plan.own_memory` the rest): host
    tensors only (device memory goes through :func:`wire`, which knows whether MPI is
    CUDA-aware), not halves (reduced in float32: :func:`reduced`), not complex (a
    tensor may be a lazy conjugate)."""
    return cpu and info.kind in "fib"


_INT_MAX = 2**31 - 1


class _Staging:
    """Process-wide switches for the device path (see :func:`force_staging`)."""

    force = os.environ.get("CLUSTERKERNEL_COMM_FORCE_STAGING", "") not in ("", "0")
    cuda_aware: bool | None = None  # None: not yet detected


STAGING = _Staging()


def force_staging(on: bool = True) -> None:
    """Route every tensor through a host staging copy, as a device tensor without
    CUDA-aware MPI would be (also ``CLUSTERKERNEL_COMM_FORCE_STAGING=1``).

    Exists to exercise the device path on machines without a GPU::

        comm.force_staging(True)
        comm.all_reduce(t)      # copies t to host, reduces, copies back
        comm.force_staging(False)
    """
    STAGING.force = bool(on)
    changed()  # the C path's answers assumed the old setting (_gate)


def cuda_aware() -> bool:
    """Whether MPI can read and write CUDA memory directly.

    ``CLUSTERKERNEL_CUDA_AWARE=1``/``0`` decides; otherwise Open MPI is asked once
    through ``ompi_info`` (MPICH and others: assumed not aware, so device tensors are
    staged through host memory, which is always correct).
    """
    if STAGING.cuda_aware is None:
        env = os.environ.get("CLUSTERKERNEL_CUDA_AWARE")
        if env is not None:
            STAGING.cuda_aware = env not in ("", "0")
        else:
            STAGING.cuda_aware = _ompi_built_with_cuda()
    return STAGING.cuda_aware


def _ompi_built_with_cuda() -> bool:
    exe = shutil.which("ompi_info")
    if exe is None:
        return False
    try:
        out = subprocess.run(
            [exe, "--parsable", "--all"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "mpi_built_with_cuda_support:value:true" in out


def dtype_of(tensor: object, what: str = "tensor") -> DType:
    """The wire description of ``tensor``'s dtype, or a clear TypeError."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise TypeError(f"{what} has layout {tensor.layout}; convert with .to_dense() first")
    info = DTYPES.get(tensor.dtype)
    if info is None:
        names = ", ".join(str(d).replace("torch.", "") for d in DTYPES)
        raise TypeError(f"{what} has unsupported dtype {tensor.dtype}; supported: {names}")
    return info


def wire(tensor: torch.Tensor, reduce: bool = False, copy_in: bool = True) -> tuple:
    """Return ``(w, info)``: a contiguous host (or MPI-visible device) tensor to hand to
    MPI, and its wire dtype.

    ``w is tensor`` when no staging is needed; otherwise ``w`` is a fresh buffer
    (holding ``tensor``'s values if ``copy_in``) and the caller copies results back
    with :func:`unstage`.
    """
    try:
        info = DTYPES[tensor.dtype]
    except (AttributeError, KeyError):
        info = dtype_of(tensor)  # raises the clear error
    if reduce:
        wired = reduced(info)
        if wired is not info:
            return _staged(tensor, torch.float32, copy_in), wired
    # A lazily conjugated complex view stores the unconjugated values: stage it.
    if tensor.is_contiguous() and not STAGING.force and not (info.kind == "c" and tensor.is_conj()):
        if tensor.is_cpu:
            return tensor, info
        if tensor.is_cuda and cuda_aware():
            # MPI reads device memory directly: the producing kernels must be done.
            torch.cuda.current_stream(tensor.device).synchronize()
            return tensor, info
    return _staged(tensor, tensor.dtype, copy_in), info


def _staged(tensor: torch.Tensor, dtype: torch.dtype, copy_in: bool) -> torch.Tensor:
    if tensor.layout != torch.strided:
        dtype_of(tensor)  # raises
    out = torch.empty(tensor.shape, dtype=dtype)
    if copy_in:
        out.copy_(tensor.detach())
    return out


def unstage(tensor: torch.Tensor, w: torch.Tensor) -> None:
    """Copy a staged result back into the user's tensor (cast, device, strides)."""
    if w is not tensor:
        tensor.detach().copy_(w)


def buf(w: torch.Tensor, info: DType) -> list:
    """The mpi4py buffer spec ``[memory, count, datatype]`` for a wire tensor."""
    count = w.numel()
    nbytes = count * info.itemsize
    address = w.data_ptr()
    if nbytes >= HUGE_THRESHOLD:
        if count > _INT_MAX:
            raise ValueError(_too_large(count))
        if w.is_cpu:
            note_buffer(address, nbytes)
    return [_fromaddress(address, nbytes), count, info.mpi]


def _too_large(count: int) -> str:
    return (
        f"tensor has {count} elements; this MPI (version {MPI.Get_version()}) takes at "
        f"most {_INT_MAX} per call: split it, e.g. with all_reduce_coalesced"
    )


def bbuf(w: torch.Tensor, info: DType) -> list:
    """Spec for a buffer holding one equal block per rank (gather/scatter side):
    ``[memory, datatype]``, so mpi4py divides the count by the group size."""
    return buf(w, info)[::2]


def as_numpy(w: torch.Tensor, info: DType) -> np.ndarray:
    """A flat numpy view of a contiguous host wire tensor (works for bool and requires_grad)."""
    return np.frombuffer(_fromaddress(w.data_ptr(), w.numel() * info.itemsize), dtype=info.np)
