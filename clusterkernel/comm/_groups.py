"""Process groups: which ranks take part in a call (a wrapper around an MPI communicator)."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterable

from mpi4py import MPI

from clusterkernel.comm._errors import CommError
from clusterkernel.protocol._engine import world as _world

_WORLD_COMM = _world()  # MPI.COMM_WORLD, or the merged world of a respawned rank


_MADE: dict[tuple[str, tuple[int, ...]], int] = {}  # groups made so far, by (name, ranks)
_LIVE: weakref.WeakSet = weakref.WeakSet()  # every group object alive in this process


class Group:
    """A set of ranks that communicate together, like a ``torch.distributed`` group.

    ``ranks`` are world ranks in group-rank order; ``rank`` is this process's rank in
    the group (-1 when it is not a member). Calls on a group this process is not in
    raise :class:`CommError`. ``src``/``dst`` arguments are always *world* ranks, as in
    torch; ``comm.rank(group)`` gives the rank inside the group. ``instance`` counts
    the groups of the same name and ranks made before this one (0 for the first).

    Example::

        evens = comm.new_group([0, 2])      # every rank calls this
        if comm.rank() in evens.ranks:
            comm.all_reduce(t, group=evens)
    """

    __slots__ = (
        "comm",
        "ranks",
        "rank",
        "size",
        "name",
        "instance",
        "_index",
        "_inner",
        "_seq",
        "_calls",
        "_sigs",
        "_sig_gen",
        "_plans",
        "_shm",
        "_hier",
        "_auto",
        "_adapt",
        "_in_flight",
        "_stale",
        "__weakref__",
    )

    def __init__(self, comm: MPI.Intracomm | None, ranks: tuple[int, ...], name: str):
        self.comm = comm
        self.ranks = ranks
        self.size = len(ranks)
        self.rank = comm.Get_rank() if comm is not None else -1
        self.name = name
        # Groups are made collectively, so the n-th group of these ranks and name is
        # the n-th on every member: the hang report tells same-named groups apart by it.
        self.instance = _MADE.get((name, ranks), 0)
        _MADE[(name, ranks)] = self.instance + 1
        self._index = {r: i for i, r in enumerate(ranks)}
        self._inner: MPI.Intracomm | None = None
        self._seq = 0
        self._calls = 0  # collectives entered: the flight recorder's sequence number
        self._sigs: set = set()  # call signatures every member has agreed on (_check)
        self._sig_gen = 0  # bumped each time _sigs starts afresh (plans cache membership)
        self._plans: dict = {}  # this rank's plans of calls on the group (_plan)
        self._shm = None  # the shared-memory segment of algorithm="shm" (_shm.segment)
        self._hier = None  # algorithm="hier"'s node and leader communicators (_hier)
        self._auto: dict | None = None  # algorithm="auto"'s rules for this group (_auto)
        self._adapt: dict | None = None  # auto's arms per op and size class (_auto.adapt)
        self._in_flight: list = []  # async calls of the arms' size classes (_auto.adapt)
        self._stale = False  # unpickled where no such group was made (find_group)
        _LIVE.add(self)

    def __reduce__(self):
        # by identity: the same group on the receiving rank (a respawned rank's copy
        # of the namespace), never its communicator
        return (find_group, (self.name, self.ranks, self.instance))

    def _reset(self, comm: MPI.Intracomm | None) -> None:
        """Bind to ``comm`` (made in a new world) and drop what the old one made."""
        self.comm = comm
        self.rank = comm.Get_rank() if comm is not None else -1
        self._inner = None
        self._seq = 0
        self._calls = 0
        self._sigs = set()
        self._sig_gen += 1
        self._plans = {}
        self._shm = None  # the old world's, abandoned by rebind_world (_shm.segment.drop_world)
        self._hier = None
        self._auto = None
        self._adapt = None  # every member starts the arms afresh, the respawned too
        self._in_flight = []

    def __repr__(self) -> str:
        return f"Group({self.name}, ranks={list(self.ranks)}, rank={self.rank})"

    def member_comm(self) -> MPI.Intracomm:
        """The communicator, or a clear error when this process is not in the group."""
        if self._stale:
            raise CommError(
                f"{self.name} came from another process's variables (a respawn's copy or a "
                "snapshot) and was not made here: make it again on every rank with "
                f"comm.new_group({list(self.ranks)})"
            )
        if self.comm is None:
            me = _WORLD_COMM.Get_rank()
            raise CommError(
                f"rank {me} is not a member of {self.name} (ranks {list(self.ranks)}); "
                "only member ranks may call communication on it, e.g. "
                "`if comm.rank() in group.ranks: ...`"
            )
        return self.comm

    def group_rank(self, world_rank: object, what: str) -> int:
        """Translate a world rank argument (``src``/``dst``) to a rank in this group."""
        idx = self._index.get(world_rank) if type(world_rank) is int else None
        if idx is None:
            if isinstance(world_rank, bool) or not isinstance(world_rank, int):
                raise TypeError(f"{what} must be an int rank, got {world_rank!r}")
            if self is WORLD:
                raise ValueError(
                    f"{what}={world_rank} is out of range: ranks are 0..{self.size - 1}"
                )
            raise ValueError(
                f"{what}={world_rank} is not in {self.name} (world ranks {list(self.ranks)}); "
                "src/dst are world ranks, as in torch.distributed"
            )
        return idx

    def inner(self) -> MPI.Intracomm:
        """A private duplicate communicator for the ring and check mode.

        Created on first use, which is always inside a collective call, so every
        member reaches the (collective) ``Dup`` together.
        """
        if self._inner is None:
            self._inner = self.member_comm().Dup()
        return self._inner

    def next_tag(self) -> int:
        """A tag for one ring call; the same sequence on every member."""
        self._seq = self._seq % 32767 + 1  # 1..32767 (MPI guarantees 32767); 0 is for objects
        return self._seq

    def free(self) -> None:
        """Release the communicators (collective over the group's members)."""
        self._plans = {}  # they hold its communicator's handle (the C path calls MPI with it)
        if self._hier is not None:
            self._hier.free()
            self._hier = None
        if self._shm is not None:
            self._shm.free()
            self._shm = None
        for c in (self._inner, self.comm):
            if c is not None and c != MPI.COMM_NULL and c is not _WORLD_COMM:
                c.Free()
        self._inner = None
        if self is not WORLD:
            self.comm = None


WORLD = Group(_WORLD_COMM, tuple(range(_WORLD_COMM.Get_size())), "world")


_WORLD_GROUP = _WORLD_COMM.Get_group()


def group_keys() -> list[tuple[str, tuple[int, ...], int]]:
    """``(name, ranks, instance)`` of every group but the world's alive here, sorted:
    what a respawn makes again, in this order, on every rank."""
    return sorted(
        {
            (g.name, g.ranks, g.instance)
            for g in _LIVE
            if g is not WORLD and g.ranks and not g._stale
        }
    )


def revoke_all() -> None:
    """On a survivor that found a peer dead: revoke the communicators of every group alive
    here (ULFM's ``MPI_Comm_revoke``, not collective), so that a survivor blocked in any
    communication on them also fails and comes to the recovery. Without it a rank that
    waits on a live peer (one that already left its collective to recover) waits for ever.
    """
    for g in list(_LIVE):
        for c in (g.comm, g._inner):
            if c is None or c == MPI.COMM_NULL:
                continue
            try:
                c.Revoke()
            except MPI.Exception:  # revoked already by another survivor's turn, or freed
                pass


def rebind_world(comm: MPI.Intracomm, keys: list | None = None) -> None:
    """After a respawn: ``comm`` (the N ranks again, old rank order) becomes the world,
    and the groups named by ``keys`` (:func:`group_keys` of one survivor; every rank
    passes the same list) are made again in it. Collective over ``comm``.

    Groups alive here that ``keys`` does not name are left without a communicator.
    """
    global _WORLD_COMM, _WORLD_GROUP, _NODE
    _WORLD_COMM = comm
    _WORLD_GROUP = comm.Get_group()
    _NODE = None  # made again, collectively, at its next use
    WORLD._reset(comm)
    mine = {(g.name, g.ranks, g.instance): g for g in _LIVE if g is not WORLD}
    for g in mine.values():
        g._reset(None)
    segments = sys.modules.get("clusterkernel.comm._shm.segment")
    if segments is not None:  # the old world's shared memory (the resets dropped its
        segments.drop_world()  # plans' views of it), before the new groups make theirs
    for name, ranks, instance in keys or []:
        made = comm.Create(_WORLD_GROUP.Incl(list(ranks)))
        made = None if made == MPI.COMM_NULL else made
        group = mine.get((name, ranks, instance))
        if group is None:  # a respawned rank: the survivors' group, under its name
            _MADE[(name, ranks)] = instance
            group = Group(made, ranks, name)
            _KEPT.append(group)
        else:
            group._reset(made)


_KEPT: list = []  # groups a respawned rank made for its copied variables to find


def find_group(name: str, ranks: tuple[int, ...], instance: int) -> Group:
    """The group alive here with this name, ranks and instance (how a Group unpickles)."""
    if name == "world":
        return WORLD
    for g in list(_LIVE):
        if (g.name, g.ranks, g.instance) == (name, tuple(ranks), instance) and not g._stale:
            return g
    # not made here (a snapshot restored into new processes): its calls say what to do
    key = (name, tuple(ranks))
    made = _MADE.get(key)
    stale = Group(None, tuple(ranks), name)
    if made is None:  # the groups this rank makes later are counted as on the others
        del _MADE[key]
    else:
        _MADE[key] = made
    stale._stale = True
    stale.instance = instance
    return stale


def _world_ranks(comm: MPI.Intracomm) -> tuple[int, ...]:
    # Local translation of group ranks to world ranks: no communication.
    ranks = MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())), _WORLD_GROUP)
    return tuple(int(r) for r in ranks)


def new_group(ranks: Iterable[int] | None = None) -> Group:
    """Create a group of the given world ranks (all of them when ``None``).

    Like ``torch.distributed.new_group``, every rank must call it with the same list,
    members or not; group ranks follow the sorted world ranks. Non-members get a
    group object whose calls raise a clear error.

    Example: ``pair = comm.new_group([0, 1])``
    """
    size = _WORLD_COMM.Get_size()
    if ranks is None:
        wanted = list(range(size))
    else:
        try:
            wanted = sorted(ranks)
        except TypeError:
            raise TypeError(f"ranks must be an iterable of ints, got {ranks!r}") from None
        bad = [r for r in wanted if isinstance(r, bool) or not isinstance(r, int)]
        if bad:
            raise TypeError(f"ranks must be ints, got {bad!r}")
        out = [r for r in wanted if not 0 <= r < size]
        if out:
            raise ValueError(f"ranks {out} are out of range: world ranks are 0..{size - 1}")
        if len(set(wanted)) != len(wanted):
            raise ValueError(f"ranks {list(ranks)} contain duplicates")
        if not wanted:
            raise ValueError("a group needs at least one rank")
    comm = _WORLD_COMM.Create(_WORLD_GROUP.Incl(wanted))
    comm = None if comm == MPI.COMM_NULL else comm
    return Group(comm, tuple(wanted), f"group{wanted}")


def split(color: int | None, key: int | None = None, group: Group | None = None) -> Group:
    """Split ``group`` (default: world) by ``color``, ordering each part by ``key``.

    Every member of ``group`` must call it. Ranks passing the same ``color`` form one
    new group; ``color=None`` means "in no group". ``key`` (default: current rank)
    orders the ranks inside each part, as ``MPI_Comm_split`` does.

    Example: ``rows = comm.split(color=comm.rank() // 2)``
    """
    parent = resolve(group)
    pcomm = parent.member_comm()
    if color is not None and (isinstance(color, bool) or not isinstance(color, int) or color < 0):
        raise ValueError(f"color must be a non-negative int or None, got {color!r}")
    if key is None:
        key = parent.rank
    elif isinstance(key, bool) or not isinstance(key, int):
        raise TypeError(f"key must be an int, got {key!r}")
    comm = pcomm.Split(MPI.UNDEFINED if color is None else color, key)
    if comm == MPI.COMM_NULL:
        return Group(None, (), f"split(color={color})")
    return Group(comm, _world_ranks(comm), f"split(color={color})")


_NODE: Group | None = None


def node_group() -> Group:
    """The ranks on this machine (shared memory); every rank must call it the first time.

    Example: ``local = comm.node_group(); comm.rank(local)`` is the local rank.
    """
    global _NODE
    if _NODE is None:
        comm = _WORLD_COMM.Split_type(MPI.COMM_TYPE_SHARED, key=_WORLD_COMM.Get_rank())
        _NODE = Group(comm, _world_ranks(comm), "node")
    return _NODE


def destroy_group(group: Group) -> None:
    """Free a group's communicators (collective over its members; no-op for non-members)."""
    if group is WORLD:
        raise ValueError("the world group cannot be destroyed")
    if group.comm is not None:
        group.free()


def resolve(group: Group | None) -> Group:
    """``None`` means the world group; anything else must be a :class:`Group`."""
    if group is None:
        return WORLD
    if type(group) is not Group:
        raise TypeError(f"group must be a comm.Group (from comm.new_group), got {group!r}")
    return group


def member(group: Group | None) -> tuple[Group, MPI.Intracomm]:
    """The group (``None``: world) and its communicator; raises if not a member."""
    g = WORLD if group is None else resolve(group)
    c = g.comm
    if c is None:
        c = g.member_comm()  # raises
    return g, c


def rank(group: Group | None = None) -> int:
    """This process's rank in ``group`` (default: world), -1 if not a member."""
    return resolve(group).rank


def size(group: Group | None = None) -> int:
    """Number of ranks in ``group`` (default: world)."""
    return resolve(group).size
