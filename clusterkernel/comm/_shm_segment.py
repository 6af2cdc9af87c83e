"""One shared-memory segment per group: an MPI-3 shared window over the group's ranks.

The segment is made on a group's first ``algorithm="shm"`` call (inside a collective,
so every member makes it together) on a private communicator split off the group's
by ``MPI_Comm_split_type(COMM_TYPE_SHARED)``: if that split is smaller than the
group, the group spans nodes and every member raises the same error. The window
(``MPI_Win_allocate_shared``, one contiguous block owned by group rank 0) holds two
*banks* of ``n`` slots of :attr:`Segment.cap` bytes; call ``k`` of the group uses
bank ``k % 2``. A call only starts once the group's previous call has finished on
this rank, and every call passes at least one barrier before it reads what others
wrote; so when call ``k + 2`` writes into bank ``k % 2`` again, every rank has left
call ``k``. That is why broadcast, all-gather and reduce-scatter need one barrier
and all-reduce two.

A call larger than the slots grows the window: at the call, in program order (so
every member grows at the same call), after this rank's earlier calls on the group
have finished. The window is freed with the group (:func:`comm.destroy_group`) and
at exit. Open MPI's backing file (``/dev/shm/osc_sm.<host>.<jobid>...``) is unlinked
as soon as every rank has mapped it, so a crash leaves no file behind. A job of
one process removes Open MPI's own shared-memory segment at exit (a singleton has
no mpiexec to do it).
"""

from __future__ import annotations

import atexit

import torch
from mpi4py import MPI

from clusterkernel import _shm_names
from clusterkernel.comm._errors import CommError
from clusterkernel.comm._groups import Group
from clusterkernel.comm._handle import Work

MIN_SLOT = 64 * 1024  # bytes; slot sizes are multiples of it
_LIVE: list[Segment] = []  # in creation order, which is the same on every member
_EXIT_HOOK: list = []  # registered once


class Segment:
    """A group's shared window, its banks, and the order of the calls using it."""

    __slots__ = (
        "comm",
        "n",
        "rank",
        "win",
        "cap",
        "mem",
        "views",
        "plans",
        "issued",
        "done",
        "last",
        "error",
    )

    def __init__(self, comm: MPI.Intracomm | None, n: int, rank: int, error: str = ""):
        self.comm = comm  # the private node communicator (None when the group spans nodes)
        self.n = n
        self.rank = rank
        self.win: MPI.Win | None = None
        self.cap = 0  # bytes per slot
        self.mem: torch.Tensor | None = None  # uint8 [2, n, cap] over the window
        self.views: dict[torch.dtype, torch.Tensor] = {}  # typed [2, n, cap // itemsize]
        self.plans: dict[tuple, tuple] = {}  # per call shape: views into a bank (_shm)
        self.issued = 0  # calls started on this group (their tickets)
        self.done = 0  # calls finished: call k may run once done == k
        self.last: Work | None = None  # the latest async call (waiting it drains all)
        self.error = error  # why shm cannot run on this group ("" when it can)

    def rows(self, ticket: int, dtype: torch.dtype) -> torch.Tensor:
        """The bank of call ``ticket`` as ``[n, cap // itemsize]`` elements of ``dtype``."""
        typed = self.views.get(dtype)
        if typed is None:
            assert self.mem is not None
            typed = self.views[dtype] = self.mem.view(dtype)
        return typed[ticket & 1]

    def reserve(self, nbytes: int) -> None:
        """Make every slot hold ``nbytes``; collective when it grows (see module doc)."""
        if nbytes <= self.cap:
            return
        self.drain()
        # The first size exactly (rounded to MIN_SLOT), then at least doubling, so a
        # slowly growing size regrows O(log) times.
        cap = max(-(-nbytes // MIN_SLOT) * MIN_SLOT, 2 * self.cap)
        self._release()
        size = 2 * self.n * cap if self.rank == 0 else 0
        win = MPI.Win.Allocate_shared(size, 1, comm=self.comm)
        mem, _ = win.Shared_query(0)
        # A passive epoch for the whole life of the window, so Win.Sync (the memory
        # barrier the MPI shared-memory model asks for around each barrier) is legal.
        win.Lock_all(MPI.MODE_NOCHECK)
        self.win = win
        self.cap = cap
        self.mem = torch.frombuffer(mem, dtype=torch.uint8).view(2, self.n, cap)

    def sync(self) -> None:
        """Order this rank's loads and stores on the window against the others'."""
        self.win.Sync()

    def drain(self) -> None:
        """Wait until this rank's earlier calls on the group have finished."""
        if self.done < self.issued and self.last is not None:
            self.last.wait()
        self.last = None

    def _release(self) -> None:
        if self.win is None:
            return
        self.views.clear()
        self.plans.clear()
        self.mem = None
        # Every member must be done reading before the memory goes away.
        self.comm.Barrier()
        self.win.Unlock_all()
        self.win.Free()
        self.win = None
        self.cap = 0

    def free(self, drain: bool = True) -> None:
        """Free the window and the node communicator (collective over the group)."""
        if self in _LIVE:
            _LIVE.remove(self)
        if self.comm is None:
            return
        if drain:
            self.drain()
        self._release()
        self.comm.Free()
        self.comm = None


def segment(group: Group) -> Segment:
    """The group's segment, made on first use; raises if the group spans nodes.

    Called inside a collective call, so every member makes it together.
    """
    seg = group._shm
    if seg is None:
        seg = group._shm = _make(group)
    if seg.error:
        raise CommError(seg.error)
    return seg


def _make(group: Group) -> Segment:
    node = group.inner().Split_type(MPI.COMM_TYPE_SHARED, key=group.rank)
    local = node.Get_size()
    if local != group.size:
        node.Free()
        return Segment(
            None,
            group.size,
            group.rank,
            error=(
                f"algorithm='shm' needs every rank of {group.name} on one node, but its "
                f"{group.size} ranks are on several nodes (this rank shares a node with "
                f"{local} of them). Use algorithm='mpi' (or 'ring' for all_reduce) for "
                "groups that span nodes, or comm.node_group() for the ranks of this node."
            ),
        )
    if not _EXIT_HOOK:
        atexit.register(_free_all)
        _EXIT_HOOK.append(_free_all)
    seg = Segment(node, group.size, group.rank)
    _LIVE.append(seg)
    return seg


def _remove_singleton_files() -> None:
    # A job of one process has nobody else using its files, and a singleton (no
    # mpiexec) has no prterun to remove them: Open MPI 5 leaves its 16 MB
    # shared-memory segment in /dev/shm after every such run otherwise.
    _shm_names.remove_prefixed(_shm_names.job_prefixes())


if MPI.COMM_WORLD.Get_size() == 1:
    atexit.register(_remove_singleton_files)


def _free_all() -> None:
    # Before MPI_Finalize (mpi4py's own exit hook runs after Python's atexit), which
    # waits for every rank anyway: freeing here adds no new way to hang at exit. A
    # call never waited for is not waited for now.
    for seg in list(_LIVE):
        seg.free(drain=False)
