"""A dead rank replaced inside the running cell (rank side): the survivors' recovery point.

With auto-respawn on (``%mpi start --respawn``) the notebook arms every rank with the
recipe of a respawn (:func:`arm`: each rank's new-process command and host). A loop
under a step guard (``Trainer.fit``, :func:`clusterkernel.train.steps`) that finds a peer
dead (``comm.PeerDiedError``) calls :func:`rejoin` at its recovery point: the survivors agree
on who is gone and start the dead ranks again in the live job (the respawn's own
``grow``), rank ``root`` (the lowest survivor) sends them its variables, DataParallel
models are attached to the N ranks again, and the loop redoes the step that failed.
Meanwhile the notebook sees the new engines register and runs :func:`joined` and then the
cell itself on them, so a new rank takes the copy and goes through the same loop, from
the same step.

Example (what a step guard does)::

    try:
        step()
    except comm.PeerDiedError:
        if not rejoin():     # not armed: the cell fails, the notebook tells the death
            raise
        step()               # again, on N ranks
"""

from __future__ import annotations

import time

from clusterkernel.protocol._errors import ClusterkernelError
from clusterkernel.rank._world import world

_ROOT = "{root}"  # in a recipe's commands: the lowest survivor, known only at a death
_recipe: dict | None = None  # {"commands": {rank: [...]}, "hosts": {rank: host or None}}
_SPAWNS_AGAIN = 2  # spawns that a death defeated, each followed by another
_rejoined: list[dict] = []  # what each recovery here did: ranks, seconds
# a new rank whose guarded loop has yet to learn where the survivors are: the rank its
# variables were copied from
_joining: int | None = None


def arm(recipe: dict | None) -> bool:
    """Keep the notebook's recipe of a respawn (None: disarm). Returns whether armed."""
    global _recipe
    _recipe = recipe
    return recipe is not None


def armed() -> bool:
    """Whether a peer's death in a guarded step is recovered here (auto-respawn is on)."""
    return _recipe is not None


def recovers(exc: BaseException) -> bool:
    """Whether ``exc`` is a peer's death (``comm.PeerDiedError``, MPI's own error for it
    where a path raises that, or a torch.distributed error: a gloo connection a dead peer
    closed) that this rank recovers from in the cell (armed). A torch error with no peer
    dead is the cell's own: :func:`rejoin` tells it by returning False."""
    if _recipe is None:
        return False
    from clusterkernel.comm._errors import is_failure

    return is_failure(exc) or _torch_failure(exc)


def _torch_failure(exc: BaseException) -> bool:
    """A torch.distributed collective's error: torch's own type for it, or the
    RuntimeError gloo raises when a peer's connection closes ("Connection closed by
    peer", "Connection reset by peer")."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and isinstance(exc, getattr(dist, "DistError", ())):
        return True
    return isinstance(exc, RuntimeError) and "gloo" in str(exc)


def agree(ok: bool) -> bool:
    """Every survivor's one agreement before a recovery (ULFM's ``MPI_Comm_agree``,
    uniform: every live rank gets the same answer): True when every live rank passed
    ``ok`` and none has died. A rank that failed passes False (in :func:`rejoin`); a loop
    at its end passes True (``train.steps``), so a peer that died in the last step is
    recovered with every survivor, also those whose last collective completed."""
    from mpi4py import MPI

    try:
        return bool(world().Agree(int(ok)))
    except MPI.Exception:  # a rank died and the failure is news here: not agreed
        return False


def rejoin(agreed: bool = False, cause: BaseException | None = None) -> bool:
    """At a recovery point, on every survivor: bring the dead ranks back into this world,
    give them the variables of a survivor, re-attach DataParallel models and make the
    torch.distributed default group again (DDP models of the namespace wrapped on it);
    False (nothing done) when not armed. ``agreed``: this rank has already taken part in
    the survivors' :func:`agree` (a loop's end). ``cause``: the error that brought the
    rank here; a torch.distributed one while no peer died is the cell's own: the ranks
    are made whole (world, torch group) and False says to raise it. A death during the
    recovery (the survivor copied from, a new rank loading its copy, another survivor)
    starts it again (see :func:`_rounds`). Raises RuntimeError, on every rank of the
    recovery, when it cannot be done (the new processes do not join, a round fails and
    nobody died in it); the cell then fails and the notebook respawns."""
    if _recipe is None:
        return False
    from clusterkernel.comm import _groups
    from clusterkernel.torchdist._regroup import free

    t0 = time.perf_counter()
    # first: a peer blocked in a gloo collective on this rank raises and comes here too
    free()
    if not agreed:
        # a survivor blocked in any communication fails too (revoked) and comes here;
        # one at the loop's end is in agree() already: every survivor agrees once
        _groups.revoke_all()
        agree(False)
    done = _rounds(holds=True, grown=False)
    if not done["ranks"] and cause is not None and _torch_failure(cause):
        return False  # nobody died (uniform: every rank's rounds spawned the same)
    _rejoined.append({**done, "seconds": time.perf_counter() - t0})
    return True


def joined(recipe: dict | None) -> dict:
    """On a new rank, before it runs the cell: its side of the survivors' :func:`rejoin`
    (the copy of a survivor's variables, DataParallel models re-attached, and any round
    a death during it starts), armed with ``recipe`` as the survivors are. Returns
    ``{"copied": [...], "root": the last round's source, "copied_from": the rank this
    one's variables came from, "ranks": every rank respawned}``."""
    global _joining

    arm(recipe)
    done = _rounds(holds=False, grown=True)
    _joining = done["copied_from"]
    _forget_joining_after_the_cell()
    return done


def _rounds(holds: bool, grown: bool) -> dict:
    """The recovery, collective over the survivors and (once they have joined) the new
    ranks, in rounds: shrink to the live ranks and spawn the dead (``grown``: done, this
    rank is a new one), then settle (one rank's variables to every rank without any,
    DataParallel re-attached). Each round ends in a uniform agreement, so every rank
    leaves it alike: done, or into the next round, which respawns whoever died during
    this one; one whose new processes did not join because a survivor or a new process
    died meanwhile is followed by a spawn of them all (twice at most). A failed round in
    which nobody died would fail again: every rank raises (a copy that kills its target
    gets no second try from the same rank: see :func:`_settle`). ``holds``: this rank has variables of its own
    (a survivor)."""
    from mpi4py import MPI

    spawned: list[int] = []
    # suspects: ranks copied from in a failed round; copied_from: where this rank's
    # variables came from (a new rank; kept across rounds, as the copy is)
    mine: dict = {"holds": holds, "suspects": set(), "copied_from": None}
    failed: str | None = None  # what failed in the last round here ("": on another rank)
    tries: list[_NotJoined] = []  # spawns that a survivor's death defeated
    while True:
        error: BaseException | None = None
        if not grown:
            try:
                died = _shrink_and_grow(spawned)
            except MPI.Exception as e:  # a death once the new ranks had joined (see grow)
                error = e
            except _NotJoined as e:  # on every survivor alike
                if e.again and len(tries) < _SPAWNS_AGAIN:  # the dead spawned (all) again
                    tries.append(e)
                    continue
                raise RuntimeError(_not_joined([*tries, e])) from None
            else:
                if not died and failed is not None:
                    raise RuntimeError(
                        f"the recovery failed: {failed or 'another rank failed its part of it'}"
                    )
        grown = False
        settled: dict | None = None
        if error is None:
            try:
                settled = _settle(mine)
            except Exception as e:  # noqa: BLE001 (a death in it, or not: the next round tells)
                error = e
        if error is not None:
            failed = f"{type(error).__name__}: {error}"
            _revoke()  # a rank still waiting in this round fails and agrees too
        if agree(settled is not None):
            assert settled is not None  # uniform: every rank passed True
            return {**settled, "copied_from": mine["copied_from"], "ranks": sorted(spawned)}
        failed = failed if settled is None else ""


def _revoke() -> None:
    """This rank's communicators revoked (the world too, grown but not yet rebound)."""
    from mpi4py import MPI

    from clusterkernel.comm import _groups

    _groups.revoke_all()
    try:
        world().Revoke()
    except MPI.Exception:  # revoked already
        pass


def _shrink_and_grow(spawned: list[int]) -> list[int]:
    """The live ranks of this world, as every one of them agrees, and the dead ones spawned
    again into it (``rank._respawn.grow``; added to ``spawned``); returns the dead ranks.
    With none dead the world (revoked by the recovery) is made again of the same ranks."""

    from clusterkernel.rank._respawn import JoinerDiedError, _group_keys, grow
    from clusterkernel.rank._world import replace

    assert _recipe is not None
    old = world()
    shrunk, alive = _shrunk(old)  # who is alive, as every survivor agrees
    dead = sorted(set(range(old.Get_size())) - set(alive))
    if not dead:
        replace(shrunk, shrunk.bcast(_group_keys() if shrunk.Get_rank() == 0 else None))
        return []
    shrunk.Free()
    spawned += [r for r in dead if r not in spawned]
    root = min(alive)
    commands = [
        [str(root) if word == _ROOT else word for word in _recipe["commands"][r]] for r in dead
    ]
    try:
        hosts = [_recipe["hosts"].get(r) for r in dead]
        grow(dead, commands, hosts, root, join_timeout=30.0, watch=True)
    except RuntimeError as e:  # they did not join; the world is as it was, on every survivor
        raise _NotJoined(dead, _lost(old, alive), str(e), isinstance(e, JoinerDiedError)) from None
    return dead


class _NotJoined(ClusterkernelError, RuntimeError):
    """The new processes of ``joining`` did not join; ``lost``: the survivors that died
    meanwhile; ``again``: one of them, or a new process, died, so that a new spawn may
    well succeed (each the same on every survivor)."""

    def __init__(self, joining: list[int], lost: list[int], why: str, died: bool) -> None:
        said = (
            f"rank {_listed(lost)} died while the replacement of rank {_listed(joining)} "
            "was joining"
            if lost
            else why
        )
        super().__init__(said)
        self.joining, self.lost = joining, lost
        self.again = bool(lost) or died


def _shrunk(old) -> tuple:
    """``(old`` shrunk to its live ranks, those ranks as ``old`` numbers them): collective
    over the survivors, and every one of them learns the same."""
    from mpi4py import MPI

    shrunk = old.Shrink()
    alive = MPI.Group.Translate_ranks(
        shrunk.Get_group(), list(range(shrunk.Get_size())), old.Get_group()
    )
    return shrunk, alive


def _lost(old, alive: list[int]) -> list[int]:
    """The ranks of ``alive`` that have died since (a new shrink of ``old``)."""
    shrunk, now = _shrunk(old)
    shrunk.Free()
    return sorted(set(alive) - set(now))


def _settle(mine: dict) -> dict:
    """Collective over the world just grown: the lowest rank with variables (one not
    copied from in a failed round, where there is one) gives them to every rank without;
    DataParallel models are re-attached on all, and where a rank had a torch default
    group every rank gets a new one (``torchdist._regroup``). Returns ``{"root",
    "copied", "ddp"}`` (``ddp``: the DDP models wrapped again, None without a group). ``mine``
    (``holds``, ``suspects``) is this rank's part, kept for a next round."""
    from clusterkernel.rank._respawn import copy_namespace, rebuild

    comm = world()
    me = comm.Get_rank()
    every = comm.allgather((mine["holds"], sorted(mine["suspects"])))
    holders = [r for r, (h, _) in enumerate(every) if h]
    if not holders:
        raise RuntimeError("no rank with variables of its own took part in the recovery")
    suspects = mine["suspects"] = {r for _, ss in every for r in ss}  # the same on all
    untried = [r for r in holders if r not in suspects]
    targets = [r for r, (h, _) in enumerate(every) if not h]
    if not untried:
        raise RuntimeError(
            f"copying the variables of rank {_listed(sorted(suspects))} to the new rank "
            f"{_listed(targets)} failed each time (a variable whose pickling or unpickling "
            f"ends the process?): rank {_listed(targets)} runs on without variables"
        )
    root = min(untried)
    if targets:
        suspects.add(root)  # until this round is agreed
    copied: list[str] = []
    if targets and (me == root or me in targets):
        copied = copy_namespace(root, targets)["copied"]
        if me in targets:
            mine["holds"], mine["copied_from"] = True, root  # a new rank with its copy
    rebuild()
    from clusterkernel.torchdist._regroup import regroup

    assert _recipe is not None
    return {"root": root, "copied": copied, "ddp": regroup(_recipe.get("torch"))}


def _not_joined(tries: list[_NotJoined]) -> str:
    """The error of a recovery whose new ranks did not join: what happened, what to do."""
    dead = sorted({r for t in tries for r in (*t.joining, *t.lost)})
    return (
        f"the recovery inside the cell failed: {'; then '.join(map(str, tries))}. "
        f"%mpi respawn brings rank {_listed(dead)} back (with --respawn the respawn "
        "after this cell does)"
    )


def _listed(ranks: list[int]) -> str:
    return ",".join(map(str, ranks))


def _forget_joining_after_the_cell() -> None:
    """The cell that follows :func:`joined` is the only one whose guarded loop joins the
    survivors: a later loop on this rank (a later cell, a cell whose loop was not a
    ``train.steps`` one) starts as on every rank."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return

    def forget(*_args: object) -> None:
        global _joining
        _joining = None
        shell.events.unregister("post_run_cell", forget)

    shell.events.register("post_run_cell", forget)


def take_joining() -> int | None:
    """On a new rank, once, if it joined a recovery and its guarded loop (``train.steps``)
    must now learn from the survivors where they are: the rank its variables were copied
    from; None otherwise."""
    global _joining
    joining, _joining = _joining, None
    return joining


def recoveries() -> list[dict]:
    """What each in-cell recovery on this rank did, oldest first (and forgets them)."""
    done = list(_rejoined)
    _rejoined.clear()
    return done
