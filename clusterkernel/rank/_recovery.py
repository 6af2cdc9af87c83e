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

from clusterkernel.rank._world import world

_ROOT = "{root}"  # in a recipe's commands: the lowest survivor, known only at a death
_recipe: dict | None = None  # {"commands": {rank: [...]}, "hosts": {rank: host or None}}
_rejoined: list[dict] = []  # what each recovery here did: ranks, seconds
_joining = False  # a new rank whose guarded loop has yet to learn where the survivors are


def arm(recipe: dict | None) -> bool:
    """Keep the notebook's recipe of a respawn (None: disarm). Returns whether armed."""
    global _recipe
    _recipe = recipe
    return recipe is not None


def armed() -> bool:
    """Whether a peer's death in a guarded step is recovered here (auto-respawn is on)."""
    return _recipe is not None


def recovers(exc: BaseException) -> bool:
    """Whether ``exc`` is a peer's death (``comm.PeerDiedError``, or MPI's own error for it
    where a path raises that) that this rank recovers from in the cell (armed)."""
    if _recipe is None:
        return False
    from clusterkernel.comm._errors import is_failure

    return is_failure(exc)


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


def rejoin(agreed: bool = False) -> bool:
    """At a recovery point, on every survivor: bring the dead ranks back into this world,
    give them ``root``'s variables and re-attach DataParallel models; False (nothing done)
    when not armed. ``agreed``: this rank has already taken part in the survivors'
    :func:`agree` (a loop's end). Raises RuntimeError when the new processes do not join
    (the survivors' world stays as it was; the cell then fails and the notebook
    respawns)."""
    if _recipe is None:
        return False
    from mpi4py import MPI

    from clusterkernel.comm import _groups
    from clusterkernel.rank._respawn import copy_namespace, grow, rebuild

    t0 = time.perf_counter()
    old = world()
    if not agreed:
        # a survivor blocked in any communication fails too (revoked) and comes here;
        # one at the loop's end is in agree() already: every survivor agrees once
        _groups.revoke_all()
        agree(False)
    shrunk = old.Shrink()  # who is alive, as every survivor agrees
    try:
        alive = MPI.Group.Translate_ranks(
            shrunk.Get_group(), list(range(shrunk.Get_size())), old.Get_group()
        )
    finally:
        shrunk.Free()
    dead = sorted(set(range(old.Get_size())) - set(alive))
    root = min(alive)
    commands = [
        [str(root) if word == _ROOT else word for word in _recipe["commands"][r]] for r in dead
    ]
    grow(dead, commands, [_recipe["hosts"].get(r) for r in dead], root, join_timeout=30.0)
    if world().Get_rank() == root:
        copy_namespace(root, dead)
    rebuild()
    _rejoined.append({"ranks": dead, "root": root, "seconds": time.perf_counter() - t0})
    return True


def joined(root: int, targets: list[int], recipe: dict | None) -> dict:
    """On a new rank, before it runs the cell: its side of the survivors' :func:`rejoin`
    (the copy of ``root``'s variables, DataParallel models re-attached), armed with
    ``recipe`` as the survivors are."""
    global _joining
    from clusterkernel.rank._respawn import copy_namespace, rebuild

    arm(recipe)
    copied = copy_namespace(root, targets)
    rebuild()
    _joining = True
    _forget_joining_after_the_cell()
    return copied


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
        _joining = False
        shell.events.unregister("post_run_cell", forget)

    shell.events.register("post_run_cell", forget)


def take_joining() -> bool:
    """On a new rank, once: True if it joined a recovery and its guarded loop
    (``train.steps``) must now learn from the survivors where they are."""
    global _joining
    joining, _joining = _joining, False
    return joining


def recoveries() -> list[dict]:
    """What each in-cell recovery on this rank did, oldest first (and forgets them)."""
    done = list(_rejoined)
    _rejoined.clear()
    return done
