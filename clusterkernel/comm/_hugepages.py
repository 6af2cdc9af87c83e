"""Back hot, large host buffers with transparent huge pages (Linux).

Open MPI moves large shared-memory messages with single-copy kernel calls whose
cost grows with the number of pages touched. numpy asks the kernel for huge pages
on arrays of 4 MB and more; torch's CPU allocator does not, and a 4 MB allreduce
on torch memory is markedly slower than on numpy memory, and slower still than on
memory fully backed by huge pages (BENCHMARKS.md, "The communication layer", the
huge pages note).

So a buffer that keeps coming back (gradients, every step) is collapsed into huge
pages once, with ``madvise(MADV_COLLAPSE)`` (Linux 6.1+), the third time it is
communicated; one-off buffers pay nothing. The range is widened to whole 2 MB
pages: that only changes how the neighbouring bytes of the same mapping are
backed, never their contents. Buffers the comm layer allocates itself (ring
scratch, fusion buckets) are 2 MB aligned and advised before first touch
(:func:`empty`). Where the calls are unsupported they are tried once and then left
alone. ``CLUSTERKERNEL_HUGEPAGES=0`` turns all of this off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

import numpy as np

HUGE = 2 * 1024 * 1024
THRESHOLD = HUGE  # smaller buffers are left as they are
HOT = 3  # collapse when a buffer is seen for the third time
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MAX_TRACKED = 4096
_ENOMEM, _EINVAL, _ENOSYS = 12, 22, 38


class _State:
    enabled = sys.platform.startswith("linux") and os.environ.get(
        "CLUSTERKERNEL_HUGEPAGES", "1"
    ) not in ("0", "")
    madvise = None
    supported: bool | None = None  # whether MADV_COLLAPSE works here (_supported)
    seen: dict[tuple[int, int], int] = {}


STATE = _State()


def _madvise():
    if STATE.madvise is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fn = libc.madvise
        fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        fn.restype = ctypes.c_int
        STATE.madvise = fn
    return STATE.madvise


def note_buffer(address: int, nbytes: int) -> None:
    """Count a use of a host buffer of ``nbytes`` (>= THRESHOLD); collapse it when hot."""
    if not STATE.enabled:
        return
    seen = STATE.seen
    key = (address, nbytes)
    count = seen.get(key, 0) + 1
    if count > HOT:
        return
    if len(seen) >= _MAX_TRACKED:
        seen.clear()  # addresses get reused; forgetting only costs a recount
    seen[key] = count
    if count == HOT:
        collapse(address, nbytes)


def _advise(start: int, end: int, advice: int) -> int:
    """madvise ``[start, end)``: 0 where the kernel took the advice, else its errno."""
    try:
        ok = _madvise()(start, end - start, advice) == 0
    except (OSError, AttributeError, TypeError):
        return _EINVAL
    return 0 if ok else ctypes.get_errno() or _EINVAL


def _supported() -> bool:
    """Whether this kernel collapses private anonymous memory at all (tried once, on a
    fresh 2 MB page of this process's own).

    One buffer's refusal says little: a range that reaches into a neighbouring mapping,
    or a buffer in shared or file memory (an MPI window, ``comm.shm_empty``), is refused
    with the same EINVAL an old kernel gives for the unknown advice."""
    if STATE.supported is None:
        raw = np.zeros(2 * HUGE, dtype=np.uint8)
        start = -(-raw.ctypes.data // HUGE) * HUGE
        raw[start - raw.ctypes.data :] = 1  # touched: collapse needs present pages
        STATE.supported = _advise(start, start + HUGE, _MADV_COLLAPSE) == 0
    return STATE.supported


def collapse(address: int, nbytes: int) -> bool:
    """Back the whole 2 MB pages around ``[address, address + nbytes)`` with huge pages
    (where the kernel refuses the widened range, those inside the buffer only).

    A refusal turns huge pages off for the process only where the kernel cannot
    collapse at all (:func:`_supported`): a neighbour or a buffer it cannot collapse
    costs that buffer alone, since one rank left without huge pages slows every large
    allreduce of its group (BENCHMARKS.md, "Collectives", "The adapting default's
    costs, measured")."""
    start = address // HUGE * HUGE
    end = -(-(address + nbytes) // HUGE) * HUGE
    err = _advise(start, end, _MADV_COLLAPSE)
    if err == 0:
        return True
    if err in (_ENOMEM, _EINVAL):  # widened into a gap or a mapping it cannot collapse
        start, end = -(-address // HUGE) * HUGE, (address + nbytes) // HUGE * HUGE
        if end <= start:
            return False
        err = _advise(start, end, _MADV_COLLAPSE)
        if err == 0:
            return True
    if err in (_EINVAL, _ENOSYS) and not _supported():
        STATE.enabled = False
    return False


def empty(count: int, dtype: np.dtype) -> np.ndarray:
    """A fresh 1-D array, 2 MB aligned and advised for huge pages when large."""
    itemsize = np.dtype(dtype).itemsize
    nbytes = count * itemsize
    if nbytes < THRESHOLD or not STATE.enabled:
        return np.empty(count, dtype=dtype)
    raw = np.empty(nbytes + HUGE, dtype=np.uint8)
    offset = -raw.ctypes.data % HUGE
    out = raw[offset : offset + nbytes].view(dtype)
    # Before the first touch, so page faults hand out huge pages directly.
    _advise(out.ctypes.data, out.ctypes.data + nbytes // HUGE * HUGE, _MADV_HUGEPAGE)
    return out


def huge_kb(address: int) -> int:
    """How much of the mapping holding ``address`` is in huge pages, in kB
    (``AnonHugePages`` in ``/proc/self/smaps``; 0 if not found or not Linux).

    Example: ``huge_kb(t.data_ptr())`` after a few calls on a 64 MB tensor.
    """
    inside = False
    try:
        with open("/proc/self/smaps") as fh:
            for line in fh:
                head = line.split()[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo <= address < hi
                elif inside and head == "AnonHugePages:":
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0
