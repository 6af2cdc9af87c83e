"""Loading and configuring the C fast path of ``comm.all_reduce`` (``_fast.c``).

The common case (a blocking allreduce of a contiguous CPU tensor whose plan says
MPI's own allreduce on the tensor's memory with no check due: ``plan.fast``, left by
:func:`~._plan.admit` and current while ``plan.stamp`` is :data:`~._gate.GATE`'s) runs
in C, with the same flight entry and timing record as the Python path. The C holds no
rules of its own: it reads the group's plan, and the ledger's layouts
(:mod:`._ledger`) it is handed here.
:func:`wrap` makes the public ``all_reduce``: a C callable that hands every other
call to the Python function. When the extension was not built (no C compiler at
install time, Python before 3.11, not Linux) the Python function is used as it is.
``CLUSTERKERNEL_FASTPATH=0`` turns the fast path off for a process; :func:`enable`
for a while.

Example::

    from clusterkernel.comm import _fastpath
    was = _fastpath.enable(False)   # Python path only (tests compare the two)
    _fastpath.enable(was)
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable

from mpi4py import MPI

from clusterkernel.comm import _flight, _ledger
from clusterkernel.comm._dtypes import DType
from clusterkernel.comm._errors import _MPIError
from clusterkernel.comm._flight import FLIGHT, INT_FIELDS, OBJ_FIELDS, OURS, PEER_NONE
from clusterkernel.comm._gate import GATE
from clusterkernel.comm._groups import WORLD, Group
from clusterkernel.comm._ledger import REC, RING
from clusterkernel.comm._ops import SUM
from clusterkernel.comm._plan import Plan

try:
    from clusterkernel.comm import _fast
except ImportError:  # not built: the Python path does everything
    _fast = None


def _libmpi_symbol(name: str) -> int:
    """The address of ``name`` in the MPI library mpi4py loaded (0 if not found).

    Looked up through mpi4py's own extension module: ``dlsym`` on its handle searches
    the libraries it was linked against, so any MPI library name works (Open MPI's
    ``libmpi.so``, MPICH's, a vendor's such as ``libmpi_cray``).
    """
    mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 1)
    try:
        fn = getattr(ctypes.CDLL(MPI.__file__, mode=mode), name)
    except (OSError, AttributeError):
        return 0
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


_MASK = 0  # handles as unsigned ints of MPI's handle size (int handles may be negative)


def _configure() -> bool:
    global _MASK
    if _fast is None or not hasattr(_fast, "configure"):
        return False
    address = _libmpi_symbol("MPI_Allreduce")
    handle_size = MPI._sizeof(MPI.Comm)
    if not address or handle_size not in (4, ctypes.sizeof(ctypes.c_void_p)):
        return False
    _MASK = (1 << (8 * handle_size)) - 1
    _fast.configure(
        allreduce=address,
        pointer_handles=handle_size != 4,
        in_place=int(MPI.IN_PLACE),
        world=WORLD,
        plan_type=Plan,
        sum=SUM,  # all_reduce's default op
        gate=GATE,  # .stamp: plans' answers (plan.fast) are current while theirs equals it
        flight=FLIGHT,
        ours=OURS,
        recorder=REC,
        error=_MPIError,  # a peer's death: PeerDiedError
        entry=(INT_FIELDS, OBJ_FIELDS, PEER_NONE),  # the flight ring's slots (_flight.py)
        record=RING,  # the timing records' ring: its memory and layout (records.COMM_LAYOUT)
    )
    if os.environ.get("CLUSTERKERNEL_FASTPATH", "1") in ("0", "off"):
        _fast.enable(False)
    return True


_READY = _configure()

# Said once per process by comm's import where a C part is missing (not where it is
# turned off): calls then cost more than they need, and nothing else says so.
MISSING = (
    "clusterkernel.comm: {what} not built (no C compiler when clusterkernel was "
    "installed), so {cost}. To get it, install a C compiler and Python's headers (Debian: apt "
    "install gcc python3-dev) and reinstall clusterkernel (pip install --force-reinstall "
    "--no-deps clusterkernel; in a checkout, pip install -e .)."
)
_FAST = (
    "the C fast path of all_reduce (comm._fast)",
    "every all_reduce runs in Python: a small call costs several times MPI's own "
    '(BENCHMARKS.md, "Collectives")',
)
_PIPE = (
    "the C chunk loop of the shared-memory all_reduce (comm._shm._cpipe)",
    "a large all_reduce through shared memory moves its chunks in Python, at up to twice "
    'the time (BENCHMARKS.md, "Collectives", "The shared-memory pipeline\'s chunk loop in C")',
)


def missing_note() -> str | None:
    """Which of comm's C parts are missing here, with what it costs and how to get
    them; None where both are built (``CLUSTERKERNEL_FASTPATH=0`` only turns one off)."""
    from clusterkernel.comm._shm import pipe

    gone = [
        part for part, built in ((_FAST, _fast is not None), (_PIPE, pipe.c_built())) if not built
    ]
    if gone:
        what = " and ".join(w for w, _ in gone) + (" are" if len(gone) > 1 else " is")
        return MISSING.format(what=what, cost="; ".join(c for _, c in gone))
    if not _READY:
        return (
            "clusterkernel.comm: the C fast path of all_reduce is built but could not find "
            "MPI_Allreduce in the MPI library, so every all_reduce runs in Python: a small "
            'call costs several times MPI\'s own (BENCHMARKS.md, "Collectives").'
        )
    return None


def writers(on: bool = True) -> bool:
    """Let the Python path (every call the C path does not take) write its flight
    entries and all_reduce's timing records through the C path's own writers (on), or
    in Python (off); returns whether they were on. Both write the same slots and rows
    (tests/comm); through C a write costs less (BENCHMARKS.md, "Collectives",
    a collective's records without allocation). Off where the extension is absent.

    Example: ``was = writers(False)`` ... ``writers(was)``.
    """
    was = _flight.use_writer(None) is not None
    _ledger.use_writer(None)
    if on and _READY:
        _flight.use_writer(_fast.flight_write)
        _ledger.use_writer(_fast.record_write)
    return was


writers(_READY)


def handles(g: Group, info: DType, mpi_op: MPI.Op) -> tuple[int, int, int] | None:
    """What a plan hands the C path: the datatype, op and ``g``'s communicator handles
    (None when the C path is not built, so no plan asks for it)."""
    if not _READY:
        return None
    mask = _MASK
    return (
        MPI._handleof(info.mpi) & mask,
        MPI._handleof(mpi_op) & mask,
        MPI._handleof(g.comm) & mask,
    )


def wrap(all_reduce: Callable) -> Callable:
    """``all_reduce`` with its common case in C, or ``all_reduce`` itself without the
    extension. The result has the function's name, docstring and signature."""
    if not _READY:
        return all_reduce
    return functools.update_wrapper(_fast.FastFunction(all_reduce), all_reduce)


def enable(on: bool = True) -> bool:
    """Turn the fast path on or off on this rank; returns whether it was on.

    Example: ``was = enable(False)`` ... ``enable(was)``.
    """
    if not _READY:
        if on:
            raise RuntimeError("the C fast path is not built on this machine")
        return False
    return _fast.enable(on)


def hits() -> int:
    """How many calls the fast path has done on this rank (0 when not built)."""
    return _fast.hits() if _READY else 0


def available() -> bool:
    """Whether the C fast path was built and configured here."""
    return _READY
