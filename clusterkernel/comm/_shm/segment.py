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

All-reduce does not use the banks: it streams through a small fixed *pipe* window
made with the segment (:mod:`.pipe`): per rank one cache line of progress
counters and :data:`PIPE_DEPTH` stage buffers of :data:`PIPE_CHUNK` bytes, so it
never grows and stays in cache.

A call larger than the slots grows the window: at the call, in program order (so
every member grows at the same call), after this rank's earlier calls on the group
have finished. The window is freed with the group (:func:`comm.destroy_group`) and
at exit. When the world is replaced (a respawn), the old world's windows cannot be
freed through MPI (their communicators hold a dead rank): :func:`drop_world` gives
their memory back on each survivor without MPI (:mod:`.unmap`). Open MPI's backing file (``/dev/shm/osc_sm.<host>.<jobid>...``) is unlinked
as soon as every rank has mapped it, so a crash leaves no file behind. A job of
one process removes Open MPI's own shared-memory segment at exit (a singleton has
no mpiexec to do it).
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
from mpi4py import MPI

from clusterkernel.comm._errors import CommError, PeerDiedError
from clusterkernel.comm._groups import Group
from clusterkernel.comm._handle import Work
from clusterkernel.comm._shm.unmap import only_ours, release, views
from clusterkernel.protocol import _shm_names
from clusterkernel.protocol._procs import pid_alive

MIN_SLOT = 64 * 1024  # bytes; slot sizes are multiples of it
PIPE_CHUNK = 256 * 1024  # bytes per stage buffer of the all-reduce pipe
# stage buffers per rank: chunk g uses buffer g % PIPE_DEPTH. At least 3: the loop holds
# three chunks at once (in c, reduce c - 1, out c - 2), and with 2 the copy in of chunk c
# waits for this rank's own copy out of c - 2, which comes after it. 4 is as fast as 3, 8
# or 16 (BENCHMARKS.md, "The pipe's depth, varied").
PIPE_DEPTH = 4
_LINE = 64  # one rank's progress counters: a cache line of its own
_LIVE: list[Segment] = []  # in creation order, which is the same on every member
# Frees that must run at exit once the segments are gone (shm_empty's arenas: alloc.py
# adds its own, so this module need not import the one that imports it).
AFTER_SEGMENTS: list[Callable[[], None]] = []
# What else to abandon with the old world's segments (alloc.py adds its arenas).
WORLD_DROPPED: list[Callable[[], None]] = []
_EXIT_HOOK: list = []  # registered once
_LOOK_EVERY = 0.25  # seconds between looks at the peers' processes while waiting on them
_ANY_SOURCE, _ANY_TAG = MPI.ANY_SOURCE, MPI.ANY_TAG


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
        "issued",
        "done",
        "last",
        "error",
        "pipe_win",
        "ctl",
        "stage",
        "stages",
        "seq",
        "pipes",
        "_scratch",
        "mine",
        "cols",
        "arenas",
        "peers",
        "_next_look",
        "made",
        "raw",
    )

    def __init__(self, comm: MPI.Intracomm | None, n: int, rank: int, error: str = ""):
        self.comm = comm  # the private node communicator (None when the group spans nodes)
        self.n = n
        self.rank = rank
        self.win: MPI.Win | None = None
        self.cap = 0  # bytes per slot
        self.mem: torch.Tensor | None = None  # uint8 [2, n, cap] over the window
        self.views: dict[torch.dtype, torch.Tensor] = {}  # typed [2, n, cap // itemsize]
        self.issued = 0  # calls started on this group (their tickets)
        self.done = 0  # calls finished: call k may run once done == k
        self.last: Work | None = None  # the latest async call (waiting it drains all)
        self.error = error  # why shm cannot run on this group ("" when it can)
        self.pipe_win: MPI.Win | None = None
        self.ctl = None  # numpy int64 [n, 8]: rank j's progress counters in row j
        self.mine = None  # ctl[rank]
        self.cols: tuple = ()  # ctl's first three columns (every rank's counters)
        self.stage: torch.Tensor | None = None  # uint8 [n, PIPE_DEPTH, PIPE_CHUNK]
        self.stages: dict[torch.dtype, torch.Tensor] = {}  # typed views of stage
        self.pipes: dict[tuple, tuple] = {}  # views of the stages per chunk size (_shm.pipe)
        self._scratch: torch.Tensor | None = None  # private float32 for small halves
        self.arenas: list = []  # shm_empty allocations on this group (_shm.alloc)
        self.seq = 0  # all-reduce chunks started on this group (same on every member)
        self.peers: dict[int, int] = {}  # world rank -> pid of every other member
        self._next_look = 0.0
        self.made: dict[str, int] = {}  # references of mem and stage when made (unmap.views)
        self.raw = None  # numpy uint8 over the pipe window, under ctl and stage

    def pause(self) -> None:
        """One turn of a wait on the other members' counters: let MPI progress, give up
        the core, and a few times a second make sure they are all alive.

        MPI moves a message only while a process is inside an MPI call: a peer may
        have left its previous call with its part done while this rank's messages of
        that call wait for this rank's side (the handshake of a large send, a ring's
        last segments), and that peer may be the one whose counter this rank waits
        for. A wait with no MPI call in it would then never end (a ring call, then a
        shared-memory one: BENCHMARKS.md, "Collectives", the adapting default's hang),
        so each turn lets MPI's progress engine run (an ``Iprobe``). A spin on a dead
        member's counter would never end either (nothing in MPI is waiting, so MPI
        cannot say); this raises ``PeerDiedError`` instead, as an MPI call on it would.
        """
        self.comm.Iprobe(_ANY_SOURCE, _ANY_TAG)
        os.sched_yield()
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + _LOOK_EVERY
        dead = [rank for rank, pid in self.peers.items() if not pid_alive(pid)]
        if dead:
            raise PeerDiedError(op="all_reduce", dead=dead)

    def open_pipe(self) -> None:
        """Make the all-reduce pipe window (collective over the node communicator)."""
        head = -(-self.n * _LINE // 4096) * 4096
        body = self.n * PIPE_DEPTH * PIPE_CHUNK
        win = MPI.Win.Allocate_shared(head + body if self.rank == 0 else 0, 1, comm=self.comm)
        mem, _ = win.Shared_query(0)
        win.Lock_all(MPI.MODE_NOCHECK)
        raw = self.raw = np.frombuffer(mem, dtype=np.uint8)
        self.stage = torch.from_numpy(raw[head : head + body]).view(self.n, PIPE_DEPTH, PIPE_CHUNK)
        self.made["stage"] = views(self.stage)
        # Every numpy view of the window holds raw: more references than now (less
        # self.raw's, dropped before they are counted again) means one is alive.
        self.made["raw"] = sys.getrefcount(raw) - 1
        self.ctl = raw[: self.n * _LINE].view(np.int64).reshape(self.n, _LINE // 8)
        self.ctl[self.rank] = 0  # the standard does not promise zeroed memory
        self.mine = self.ctl[self.rank]
        self.cols = (self.ctl[:, 0], self.ctl[:, 1], self.ctl[:, 2])
        self.pipe_win = win
        win.Sync()
        self.comm.Barrier()  # nobody reads a counter before its owner zeroed it
        win.Sync()

    def scratch(self, dtype: torch.dtype, count: int) -> torch.Tensor:
        """A private buffer of ``count`` elements of ``dtype`` (up to one stage buffer)."""
        if self._scratch is None:
            self._scratch = torch.empty(PIPE_CHUNK, dtype=torch.uint8)
        return self._scratch.view(dtype)[:count]

    def stage_rows(self, dtype: torch.dtype) -> torch.Tensor:
        """The stage buffers as ``[n, PIPE_DEPTH, PIPE_CHUNK // itemsize]`` of ``dtype``."""
        typed = self.stages.get(dtype)
        if typed is None:
            typed = self.stages[dtype] = self.stage.view(dtype)
        return typed

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
        self.made["mem"] = views(self.mem)

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
        if self.pipe_win is not None:
            self.stages.clear()
            self.pipes.clear()
            self.ctl = self.stage = self.mine = self.raw = None
            self.cols = ()
            self.comm.Barrier()  # nobody still reads the counters or stages
            self.pipe_win.Unlock_all()
            self.pipe_win.Free()
            self.pipe_win = None
        self.comm.Free()
        self.comm = None

    def abandon(self) -> bool:
        """On a survivor of a respawn: forget this old-world segment without MPI (its
        communicators hold a dead rank) and give its windows' memory back, unless
        something else still views them (then they stay mapped). No MPI call is
        made on it again, at exit neither. Returns whether both windows went back."""
        if self in _LIVE:
            _LIVE.remove(self)
        self.views.clear()
        self.stages.clear()
        self.pipes.clear()
        self.ctl = self.mine = None
        self.cols = ()
        self.arenas = []  # alloc.py abandons them itself
        gone = True
        raw, self.raw = self.raw, None
        for name in ("mem", "stage"):
            t = getattr(self, name)
            setattr(self, name, None)
            if t is None:
                continue
            if only_ours(t, self.made[name]) and (
                name == "mem" or sys.getrefcount(raw) <= self.made["raw"]
            ):
                release(t.data_ptr())
            else:
                gone = False
        self.win = self.pipe_win = self.comm = None  # handles of the old world: never freed
        self.cap = 0
        self.error = "this segment belonged to the world before a respawn"
        return gone


def drop_world() -> None:
    """The world is being replaced (a respawn or a shrink): every segment and
    :func:`~.alloc.shm_empty` window of the old one is abandoned on this rank, its
    memory given back where nothing still views it (see :meth:`Segment.abandon`).
    Not collective: it makes no MPI call. Call it before the new world's groups
    make their segments, so those reuse the memory just freed.

    Example::

        drop_world()       # in comm's rebind of the world, before the new groups
    """
    for seg in list(_LIVE):
        seg.abandon()
    for then in WORLD_DROPPED:
        then()


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
    pids = node.allgather(os.getpid())
    seg.peers = {group.ranks[i]: pid for i, pid in enumerate(pids) if i != group.rank}
    seg.open_pipe()
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
    for then in AFTER_SEGMENTS:
        then()
