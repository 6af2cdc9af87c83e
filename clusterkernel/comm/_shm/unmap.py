"""Giving an abandoned shared window's memory back without MPI.

After a respawn the old world's windows cannot be freed with ``MPI_Win_free``: that
is collective over a communicator that holds a dead rank (a survivor would wait in
it for ever). Their memory is still mapped on every survivor, about a gigabyte per
respawn with DataParallel's buckets of a 100 MB model (BENCHMARKS.md, "Freeing the
dead world's windows"). Open MPI maps each window as one shared mapping of a file
it unlinks once every rank has mapped it, so the pages go back to the system when
the last process stops mapping them. :func:`release` replaces that mapping, in
place, by an inaccessible reservation of the same addresses: the pages are freed,
and no later mapping can land there, so Open MPI unmapping the window's addresses
at exit (it still holds the handle) cannot take memory that is in use by then.

Only memory that no tensor still views may go: :func:`only_ours`.
"""

from __future__ import annotations

import ctypes
import mmap

import torch

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_PROT_NONE = 0  # the mmap module names only the others
_MAP_FIXED = 0x10
_MAP_NORESERVE = 0x4000
_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED | _MAP_NORESERVE


def views(t: torch.Tensor) -> int:
    """How many references ``t``'s memory has now (tensors over it among them): taken
    when a window's tensor is made, and again before its memory goes, it tells
    whether a view of it made since is still alive (see :func:`only_ours`).

    Example: ``views(seg.mem)``
    """
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def only_ours(t: torch.Tensor, made: int) -> bool:
    """Whether no view of ``t`` is alive: its memory has no more references than the
    ``made`` it had when it was made (:func:`views` then).

    Example: ``only_ours(seg.mem, seg.bases["mem"])`` after the segment's own views went.
    """
    return views(t) <= made


def shared_mapping(addr: int) -> tuple[int, int] | None:
    """``(start, end)`` of this process's shared file mapping holding ``addr``, or
    None when ``addr`` lies in no such mapping.

    Example: ``shared_mapping(seg.mem.data_ptr())``
    """
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= addr < hi:
                return (lo, hi) if fields[1][3] == "s" and fields[4] != "0" else None
    return None


def release(addr: int) -> bool:
    """Give back the shared mapping holding ``addr`` (see the module doc); False when
    ``addr`` is in no shared file mapping (then nothing changes). Nothing may touch
    those addresses afterwards: callers check :func:`only_ours` first.

    Example: ``release(seg.mem.data_ptr())``
    """
    span = shared_mapping(addr)
    if span is None:
        return False
    lo, hi = span
    got = _libc.mmap(lo, hi - lo, _PROT_NONE, _FLAGS, -1, 0)
    if got != lo:
        err = ctypes.get_errno()
        raise OSError(err, f"could not give back the shared window at {lo:#x}: mmap failed")
    return True
