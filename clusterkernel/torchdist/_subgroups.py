"""The user's torch.distributed subgroups, recorded as made and made again after a respawn
(rank side).

A group made with ``dist.new_group`` (``new_subgroups`` and
``new_subgroups_by_enumeration`` go through it) holds connections of the world it was
made in: once a respawn has closed them and made a new default group, the old object
fails or hangs. :func:`watch` wraps the function every such call goes through
(``distributed_c10d._new_group_with_tag``, wrapped by the same import hook as the group
sockets, :mod:`._sockets`) and records each call's ranks, backend, timeout and options,
in the order made. A new default group (:func:`~clusterkernel.torchdist._group.init`)
sets them aside (:func:`rotate`); :func:`remake`, collective over the world, makes each
again with ``dist.new_group`` in that same order on every rank (``new_group`` is
collective over the world: a new rank takes the list of the lowest rank that has one)
and binds the user's names that held an old group to its new one.

What is rebound, on each rank: a name holding a group, a list, tuple or dict holding
groups (one level: ``cur, subs = dist.new_subgroups(2)`` gives both back), and the
group of a DDP model (``DDP(net, process_group=cur)``, wrapped again on the new one by
:func:`~clusterkernel.torchdist._rewrap.rewrap_namespace`). A respawned rank, whose copy
of a survivor's variables cannot hold groups (they do not pickle: the copy carries
:class:`Regrouped` in their place), gets at each such name the group of the survivors'
view that it is a member of, else torch's ``NON_GROUP_MEMBER``, as ``new_group`` gives a
non-member; one respawned empty (no ``--from``: it has none of those names) only takes
part in making them. A new default group in the same processes (``%mpi torch-reinit``,
:func:`~clusterkernel.torchdist._group.reinit`) has them made again the same way. Not
made again: groups made with ``use_local_synchronization=True`` (only their members
made them: no rank knows the whole order) and a ``DeviceMesh``'s (it holds them by
name: make the mesh again, or rebuild with ``torchdist.Keeper``).

Example (in ``%%mpi`` cells; a respawn runs the second part)::

    g = dist.new_group([0, 1])          # recorded on every rank
    ...                                 # rank 1 dies; %mpi respawn --from 0
    rotate()                            # a new default group was made
    remake(namespace)                   # -> {"names": ["g"], "ddp": {}}: g works again
"""

from __future__ import annotations

import inspect
import pickle
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from clusterkernel.protocol._engine import world

_MAKER = "_new_group_with_tag"
_MESH = "mesh_"  # the group_desc DeviceMesh gives its groups
_DDP = ".process_group"  # the key of a DDP model's group in a path

_lock = threading.Lock()
_made: list[_Made] = []  # made under the current default group, in order
_before: list[_Made] = []  # made under the one before it: what remake makes again
# an old group -> the newest remake made in its place (what rewrap puts a DDP model on)
_again: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_watched = False


@dataclass
class _Made:
    """One ``new_group`` call: what :func:`remake` passes ``new_group`` again, and the
    group it gave."""

    ranks: list[int] | None
    timeout: Any
    backend: str | None
    options: Any
    pg_tag: str | None
    group_desc: str | None
    sort_ranks: bool
    device_id: Any = None  # this rank's own device: not sent to another rank
    # the group it gave, weakly (a record must not keep a group the user let go alive);
    # None on a rank not in it (torch's NON_GROUP_MEMBER)
    ref: Any = field(default=None, repr=False)

    def group(self):
        """The group made, while something still holds it; else None."""
        return self.ref() if self.ref is not None else None

    def wire(self) -> dict:
        """What another rank needs to make it again (options where they pickle)."""
        try:
            options = pickle.loads(pickle.dumps(self.options))
        except Exception:  # torch's Options objects need not pickle: the new rank's default
            options = None
        return {
            "ranks": self.ranks,
            "timeout": self.timeout,
            "backend": self.backend,
            "options": options,
            "pg_tag": self.pg_tag,
            "group_desc": self.group_desc,
            "sort_ranks": self.sort_ranks,
        }


class Regrouped:
    """What a respawn's copy carries for a torch.distributed group (a group cannot be
    pickled): :func:`remake` puts the group made again in its place on the new rank."""

    def __repr__(self) -> str:
        return (
            "<a torch.distributed group that was not made again on this rank: "
            "make it with dist.new_group(...) on every rank>"
        )


def watch(c10d) -> None:
    """Record every group ``c10d`` (``torch.distributed.distributed_c10d``) makes
    through ``new_group`` from now on. Idempotent."""
    global _watched
    with _lock:
        if _watched or not hasattr(c10d, _MAKER):
            return
        made = getattr(c10d, _MAKER)
        signature = inspect.signature(made)

        def maker(*args, **kwargs):
            group = made(*args, **kwargs)
            _record(signature.bind(*args, **kwargs).arguments, group)
            return group

        maker.__wrapped__ = made  # type: ignore[attr-defined]
        setattr(c10d, _MAKER, maker)
        _watched = True


def _record(call: dict, group) -> None:
    if call.get("use_local_synchronization") or str(call.get("group_desc") or "").startswith(_MESH):
        return  # not made again: see the module
    ranks = call.get("ranks")
    backend = call.get("backend")
    made = _Made(
        ranks=None if ranks is None else [int(r) for r in ranks],
        timeout=call.get("timeout"),
        backend=None if backend is None else str(backend),
        options=call.get("backend_options"),
        pg_tag=call.get("pg_tag"),
        group_desc=call.get("group_desc"),
        sort_ranks=bool(call.get("sort_ranks", True)),
        device_id=call.get("device_id"),
        ref=weakref.ref(group) if not isinstance(group, int) and group is not None else None,
    )
    with _lock:
        _made.append(made)


def rotate() -> None:
    """A new default group was made: the groups made so far belong to the old one and
    are what :func:`remake` makes again (those of any earlier one are dropped)."""
    with _lock:
        _before[:] = _made
        _made.clear()


def forget() -> None:
    """The groups were destroyed on purpose: nothing to make again."""
    with _lock:
        _made.clear()
        _before.clear()


def remake(ns: dict, live: bool = True) -> dict:
    """Collective over the world, once a new default group spans it (``live``: this
    rank has it; where one has not, nothing is made): the groups made under the old
    one that a rank still holds made again, in the same order, and ``ns``'s names
    rebound (see the module). Returns ``{"names": [...], "ddp": {name: new group}}``:
    the names rebound on any rank, and the new group of each DDP model that held an
    old one."""
    with _lock:
        before = list(_before)
        _before.clear()
    comm = world()
    mine = [m.wire() for m in before] if before else None
    every = comm.allgather((live, mine, [m.group() is not None for m in before]))
    listed = [specs for _, specs, _ in every if specs is not None]
    if not listed or not all(up for up, _, _ in every):
        return {"names": [], "ddp": {}}
    import torch.distributed as dist

    specs = listed[0]
    own = before if mine is not None and _same(mine, specs) else []
    # a group no rank holds any more (the user let it go) is not made again
    kept = [any(held[i] for _, s, held in every if s is not None and _same(s, specs))
            for i in range(len(specs))]  # fmt: skip
    new = [
        _make(dist, spec, own[i] if own else None) if kept[i] else None
        for i, spec in enumerate(specs)
    ]
    index = {id(m.group()): i for i, m in enumerate(own) if m.group() is not None}
    with _lock:
        # each old group to the newest made in its place: one made in an earlier remake
        # and made again now is let go (its store with it) once nothing else holds it
        newest = {id(m.group()): new[i] for i, m in enumerate(own) if m.group() is not None}
        for old, made in list(_again.items()):
            _again[old] = newest.get(id(made), made)
        _again.update({m.group(): new[i] for i, m in enumerate(own) if m.group() is not None})
    where = _paths(ns, index)
    held: dict[tuple, set[int]] = {}
    for paths in comm.allgather(where):
        for path, i in paths.items():
            held.setdefault(path, set()).add(i)
    me = dist.get_rank()
    ddp: dict[str, Any] = {}
    for path, found in sorted(held.items(), key=repr):
        if own:  # a survivor's own view is exact; a non-member's stays as it is
            if path not in where:
                continue
            i = where[path]
        else:  # a new rank: the group of the survivors' view it is a member of
            if path[0] not in ns:
                continue  # respawned empty (no copy): it only took part in making them
            members = sorted(i for i in found if specs[i]["ranks"] in (None, [])
                             or me in specs[i]["ranks"])  # fmt: skip
            if path[1] == _DDP and not members:
                continue
            i = members[0] if members else -1
        group = new[i] if i >= 0 else dist.GroupMember.NON_GROUP_MEMBER
        if path[1] == _DDP:
            ddp[path[0]] = group
        else:
            _bind(ns, path, group)
    names = sorted({path[0] for path in held if path[1] != _DDP})
    return {"names": names, "ddp": ddp}


def again(group):
    """The group :func:`remake` made last in place of ``group``, else None (not one it
    made again, or the default group).

    Example: ``again(ddp.process_group)`` after ``%mpi torch-reinit``: the new ``cur``
    """
    with _lock:
        return _again.get(group) if group is not None else None


def _same(mine: list[dict], specs: list[dict]) -> bool:
    """Whether two ranks' lists are of the same calls (ranks, in order)."""
    return [s["ranks"] for s in mine] == [s["ranks"] for s in specs]


def _make(dist, spec: dict, mine: _Made | None):
    """``spec`` made again through torch's own ``new_group`` (recorded again by :func:`watch`)."""
    options = mine.options if mine is not None else spec["options"]
    device_id = mine.device_id if mine is not None else None
    kwargs = {
        "ranks": spec["ranks"],
        "timeout": spec["timeout"],
        "backend": spec["backend"],
        "group_desc": spec["group_desc"],
        "device_id": device_id,
        "sort_ranks": spec["sort_ranks"],
    }
    if spec["pg_tag"] is None:
        return dist.new_group(pg_options=options, **kwargs)
    from torch.distributed import distributed_c10d as c10d

    return getattr(c10d, _MAKER)(backend_options=options, pg_tag=spec["pg_tag"], **kwargs)


def _paths(ns: dict, index: dict[int, int]) -> dict[tuple, int]:
    """``{(name, key): i}``: where ``ns`` holds the old group ``i`` (``key`` None for the
    name itself, a list index or dict key inside it, or a DDP model's group)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    out: dict[tuple, int] = {}
    for name, value in list(ns.items()):
        if name.startswith("_"):
            continue
        if id(value) in index:
            out[(name, None)] = index[id(value)]
        elif isinstance(value, DDP) and id(value.process_group) in index:
            out[(name, _DDP)] = index[id(value.process_group)]
        elif type(value) in (list, tuple):
            out.update({(name, k): index[id(v)] for k, v in enumerate(value) if id(v) in index})
        elif type(value) is dict:
            out.update(
                {
                    (name, k): index[id(v)]
                    for k, v in value.items()
                    if id(v) in index and isinstance(k, (str, int))
                }
            )
    return out


def _bind(ns: dict, path: tuple, group) -> None:
    name, key = path
    if key is None:
        ns[name] = group
        return
    held = ns.get(name)
    if isinstance(held, dict) and key in held:
        held[key] = group
    elif isinstance(held, list) and isinstance(key, int) and key < len(held):
        held[key] = group
    elif type(held) is tuple and isinstance(key, int) and key < len(held):
        ns[name] = (*held[:key], group, *held[key + 1 :])


def for_copy(value):
    """What a respawn's copy sends for ``value``: :class:`Regrouped` for a group, the
    same container with :class:`Regrouped` for its groups (one level), else ``value``."""
    import torch.distributed as dist

    def one(v):
        return Regrouped() if isinstance(v, dist.ProcessGroup) else v

    if isinstance(value, dist.ProcessGroup):
        return Regrouped()
    if type(value) in (list, tuple) and any(isinstance(v, dist.ProcessGroup) for v in value):
        return type(value)(map(one, value))
    if type(value) is dict and any(isinstance(v, dist.ProcessGroup) for v in value.values()):
        return {k: one(v) for k, v in value.items()}
    return value
