"""Bring dead ranks back into the live MPI job, the survivors untouched (rank side).

Built on MPI's own fault tolerance (Open MPI's ULFM, ``--fault-tolerant``): the
survivors agree on who is gone and make a communicator of themselves
(``MPI_Comm_shrink``), start one new process per dead rank (``MPI_Comm_spawn``, each
its own MPI job, on the dead rank's host), merge with each (``MPI_Intercomm_merge``)
and order the result by the old rank numbers (``MPI_Comm_split``). That communicator
becomes every rank's world (:mod:`clusterkernel.rank._world`); comm's groups are made
again in it. The survivors stay the same processes with every variable; a new process
runs this module as its program, joins, and then starts the ipyparallel engine it
replaces, under the dead rank's engine id.

:func:`copy_namespace` then gives the new ranks the picklable variables of a
survivor (one pickle, so an optimizer keeps pointing at its model's parameters),
sent over MPI, not through the controller, into their user namespace itself
(:mod:`clusterkernel.rank._variables`).

Example (what ``cluster.respawn(source=0)`` runs; the client side is
``clusterkernel.client.cluster._respawn``)::

    grow(dead=[2], commands=[[python, "-m", "clusterkernel.rank._respawn", ...]],
         hosts=[None], root=0)                       # on ranks 0, 1, 3
    copy_namespace(source=0, targets=[2])            # on ranks 0 and 2
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import runpy
import sys
import threading
import time
from collections.abc import Iterator

from clusterkernel.protocol._engine import set_world
from clusterkernel.protocol._errors import ClusterkernelError
from clusterkernel.protocol._procs import Joiners, announce
from clusterkernel.rank._variables import pickled, put_back, user_namespace
from clusterkernel.rank._world import replace, world

# the timed parts of the respawns on this rank (see phases()); bounded, so a job that
# never reads them keeps only the latest
_phases: collections.deque = collections.deque(maxlen=256)


@contextlib.contextmanager
def timed(phase: str) -> Iterator[None]:
    """Record how long the block takes as one part of a respawn (:func:`phases`), also
    when it fails. Cheap enough to stay on: two clock reads and an append."""
    at, t0 = time.time(), time.perf_counter()
    try:
        yield
    finally:
        _phases.append({"phase": phase, "at": at, "seconds": time.perf_counter() - t0})


def phases() -> list[dict]:
    """The timed parts of the respawns on this rank since the last call, oldest first
    (and forgets them): ``{"phase", "at" (wall clock, ``time.time()``, at its start),
    "seconds"}``. Parts: on a survivor ``shrink``, ``spawn`` (until the new processes
    have joined MPI), ``merge``, ``agree``, ``keys`` (comm's groups made again);
    ``pickle`` and ``send`` on the rank copied from; on a new rank ``started`` (its
    process's start to its joiner's first line), ``merge``, ``keys``, then ``receive``
    and ``load`` (its copy); on every rank ``rebuild`` (DataParallel models re-attached,
    rank 0's parameters broadcast).

    Example (on every rank, after a cell in which a rank was replaced)::

        from clusterkernel.rank._respawn import phases
        [(p["phase"], round(p["seconds"], 2)) for p in phases()]
    """
    done = list(_phases)
    _phases.clear()
    return done


def _group_keys() -> list:
    groups = sys.modules.get("clusterkernel.comm._groups")
    return groups.group_keys() if groups is not None else []


def grow(
    dead: list[int],
    commands: list[list[str]],
    hosts: list[str | None],
    root: int,
    join_timeout: float = 60.0,
    watch: bool = False,
) -> dict:
    """On every survivor: spawn one process per rank in ``dead`` (``commands[i]`` on
    ``hosts[i]``, None: where MPI places it) and make the N ranks one world again.

    Collective over the survivors; ``root`` is the lowest survivor. Returns this
    rank's timings in seconds. Raises RuntimeError when the new processes have not
    joined within ``join_timeout`` s or SIGINT came first (the client sends it when it
    sees a new process or a survivor die), or, with ``watch`` (a recovery inside a running
    cell, which no SIGINT reaches), as soon as MPI knows a survivor died: the world stays
    as it was, so a later ``grow`` can try again.
    """
    from mpi4py import MPI

    old = world()
    me = old.Get_rank()
    t0 = time.perf_counter()
    with timed("shrink"):
        shrunk = old.Shrink()
    t1 = time.perf_counter()
    infos = []
    for host in hosts:
        info = MPI.Info.Create()
        if host:
            info.Set("host", host)
        infos.append(info)
    joined: dict = {}

    def join() -> None:
        # In a thread: a new process that dies before it connects leaves MPI_Comm_spawn
        # waiting (Open MPI's connect/accept waits 600 s for its port), in C, where
        # neither a deadline nor SIGINT reaches; this thread stays behind in that case.
        try:
            comm = shrunk
            # One MPI job per new process, each spawned by the world grown so far (those
            # spawned before it take part): Open MPI 5.0 cannot spawn any more once a
            # process of a spawned job of several exits with an error while another of that
            # job lives on (MPI_ERR_INTERN; BENCHMARKS.md, "Faults", the chain of deaths).
            for i, (command, info) in enumerate(zip(commands, infos)):
                later = len(commands) - 1 - i
                with timed("spawn"):
                    inter = comm.Spawn(command[0], _told_later(command[1:], later), 1, info, 0)
                with timed("merge"):
                    comm = inter.Merge(high=False)
            joined["comm"] = comm.Split(0, me)
        except BaseException as e:  # noqa: BLE001 (told to the caller below)
            joined["error"] = e

    joiners = Joiners(dead) if watch else None
    thread = threading.Thread(target=join, name="clusterkernel-respawn-join", daemon=True)
    thread.start()
    deadline = time.monotonic() + join_timeout
    why, died = "", []
    try:
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(0.05)
            if watch and _failed(shrunk):  # the spawn, collective over them, cannot end
                why = "a survivor died while they joined"
                break
            died = joiners.died() if joiners is not None else []
            if died:
                why = f"the new process of rank {_ranks(died)} died before it joined"
                shrunk.Revoke()  # the survivors that cannot see it (another host) stop too
                break
    except KeyboardInterrupt:
        why = "the respawn was stopped (SIGINT)"
    if thread.is_alive():
        _abandoned.append(thread)
        why = why or f"not within {join_timeout:.0f}s (the new process died or never started)"
    elif "error" in joined:
        why = f"{type(joined['error']).__name__}: {joined['error']}"
    for info in infos:
        info.Free()
    # Every survivor takes the new world or none does (one whose spawn failed while
    # another's succeeded would leave the survivors in different worlds, and the next
    # collective would hang); the agreement stands even if a survivor has died.
    # A bitwise AND over the survivors: bit 0, every one joined; bit 1, none saw a new
    # process die before it joined (only one on its host can), so all know it alike.
    flag = (0 if why else _JOINED) | (0 if died else _NONE_DIED)
    try:
        with timed("agree"):
            flag = shrunk.Agree(flag)
    except MPI.Exception as e:
        flag, why = flag & ~_JOINED, why or f"a survivor died ({e})"
    if not flag & _JOINED:
        if not flag & _NONE_DIED:  # said alike on every survivor
            raise JoinerDiedError(f"the new process of rank {_ranks(dead)} died before it joined")
        raise RuntimeError(f"rank {_ranks(dead)} did not join: {why or 'another survivor failed'}")
    comm = joined["comm"]
    # the grown world is every survivor's from here on, also where a death fails what
    # follows on some of them only: an in-cell recovery's next round starts from it
    set_world(comm)
    with timed("keys"):
        replace(comm, comm.bcast(_group_keys() if me == root else None, root=root))
    return {"shrink": t1 - t0, "spawn": time.perf_counter() - t1, "size": comm.Get_size()}


_JOINED, _NONE_DIED = 1, 2  # the bits of the survivors' agreement after a spawn


class JoinerDiedError(ClusterkernelError, RuntimeError):
    """A new process died before it joined the survivors (seen on its host): spawning it
    again may well succeed, where a spawn that failed otherwise would fail again."""


def _failed(comm) -> bool:
    """Whether a process of ``comm`` is known here to have died (ULFM). A probe for a
    message nobody sends lets MPI progress first: the news of a death is taken in there
    (the join thread's spawn does not), and an any-source probe fails once it is."""
    from mpi4py import MPI

    from clusterkernel.comm._errors import is_failure

    try:
        comm.Iprobe(source=MPI.ANY_SOURCE, tag=_NO_MESSAGE)
    except MPI.Exception as e:
        if not is_failure(e):
            raise
        return True
    group = comm.Get_failed()
    try:
        return group.Get_size() > 0
    finally:
        group.Free()


_NO_MESSAGE = 7319  # a tag no message of the survivors' shrunk communicator carries


# join threads left waiting in MPI by a respawn that gave up on its new processes
_abandoned: list[threading.Thread] = []


def _ranks(ranks: list[int]) -> str:
    return ",".join(map(str, ranks))


def copy_namespace(source: int, targets: list[int]) -> dict:
    """Run on ``source`` and every rank in ``targets`` at once: the targets get the
    source's picklable variables (modules imported again by name).

    The bytes of CPU tensors travel out of band, each storage sent from its own memory
    and received into the memory the new tensor keeps (``_variables.dumps``): no copy of
    them through a pickle on either side.

    Returns on the source ``{"copied": [...], "skipped": {name: why}, "bytes": n}``,
    on a target ``{"copied": [...]}``.
    """
    from mpi4py import MPI

    comm = world()
    me = comm.Get_rank()
    tag = 7311
    if me == source:
        with timed("pickle"):
            buffers: list = []
            blob, names, skipped = pickled(user_namespace(), buffers)
            raw = [b.raw() for b in buffers]
        with timed("send"):
            for t in targets:
                comm.send((len(blob), [r.nbytes for r in raw]), dest=t, tag=tag)
                comm.Send([blob, MPI.BYTE], dest=t, tag=tag)
                for r in raw:
                    comm.Send([r, MPI.BYTE], dest=t, tag=tag)
        return {
            "copied": names,
            "skipped": skipped,
            "bytes": len(blob) + sum(r.nbytes for r in raw),
        }
    with timed("receive"):
        size, sizes = comm.recv(source=source, tag=tag)
        blob = bytearray(size)
        comm.Recv([blob, MPI.BYTE], source=source, tag=tag)
        held = [_received(comm, source, tag, n) for n in sizes]
    with timed("load"):
        return {"copied": put_back(*pickle.loads(blob, buffers=held))}


def _received(comm, source: int, tag: int, nbytes: int):
    """One out-of-band buffer of the copy, received straight into a new uint8 torch
    tensor, whose storage the copied tensor then keeps (``_variables._storage_from``):
    torch's own memory, resizable. Not numpy's: it asks for huge pages for large arrays,
    whose first touch made the receive twice as slow in a respawn (BENCHMARKS.md,
    "Faults", "The copy's page faults"); and a tensor seen as numpy cannot resize."""
    import torch
    from mpi4py import MPI

    t = torch.empty(nbytes, dtype=torch.uint8)
    if nbytes:
        comm.Recv([MPI.buffer.fromaddress(t.data_ptr(), nbytes), MPI.BYTE], source, tag)
    else:
        comm.Recv([bytearray(0), MPI.BYTE], source, tag)
    return t


def rebuild() -> list[int]:
    """On every rank, after a respawn and its copy: re-attach the DataParallel models
    every rank has (``train._ddp.rebuild_after_respawn``). Collective over the world."""
    ddp = sys.modules.get("clusterkernel.train._ddp")
    with timed("rebuild"):
        every = world().allgather(ddp.wrap_state() if ddp is not None else ([], 0))
        if not any(nxt for _, nxt in every):
            return []  # no rank ever wrapped a model
        from clusterkernel.train import _ddp  # a new rank learns the count the others are at

        return _ddp.rebuild_after_respawn(every)


def _told_later(args: list[str], later: int) -> list[str]:
    """A new process's arguments (``-m clusterkernel.rank._respawn RANK ... ROOT -- ...``)
    with how many processes are spawned after it, each of which it helps spawn."""
    split = args.index("--")
    return [*args[:split], str(later), *args[split:]]


def main(argv: list[str]) -> None:
    """A new rank's program: ``RANK SIZE LOCAL_RANK LOCAL_SIZE ROOT [LATER] --
    ENGINE_COMMAND...`` (``LATER``: how many new processes are spawned after this one).

    Joins the survivors (and spawns the later ones with them), then runs the engine
    command (``python -m MODULE ARGS``) in this process, as the launcher would have.
    """
    split = argv.index("--")
    rank, size, local_rank, local_size, root, *later = map(int, argv[:split])
    announced = announce(rank)  # the survivors on this host tell a death before joining
    program = argv[split + 1 :]
    # what MPI would have told the dead rank, for code that reads its environment
    os.environ.update(
        OMPI_COMM_WORLD_RANK=str(rank),
        OMPI_COMM_WORLD_SIZE=str(size),
        OMPI_COMM_WORLD_LOCAL_RANK=str(local_rank),
        OMPI_COMM_WORLD_LOCAL_SIZE=str(local_size),
    )
    start = _started()
    _phases.append({"phase": "started", "at": start, "seconds": time.time() - start})
    from mpi4py import MPI

    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        raise SystemExit("clusterkernel.rank._respawn: not started by MPI_Comm_spawn")
    with timed("merge"):
        comm = parent.Merge(high=True)
        for _ in range(later[0] if later else 0):  # the command is the spawning root's
            comm = comm.Spawn(sys.executable, None, 1, MPI.INFO_NULL, 0).Merge(high=False)
        comm = comm.Split(0, rank)
    if announced is not None:
        announced.unlink(missing_ok=True)
    with timed("keys"):
        _take_world(comm, root)
    if program[1:2] != ["-m"] or len(program) < 3:
        raise SystemExit(f"clusterkernel.rank._respawn: cannot run {program!r}")
    module = program[2]
    sys.argv = [module, *program[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _take_world(comm, root: int) -> None:
    """A new rank's side of ``grow``'s last step: ``comm`` (the N ranks) becomes its world
    and comm's groups are made again in it, as on the survivors.

    The root sends the group keys only once the survivors have agreed on this world: a
    rank that dies after that fails the groups' collectives here as on the survivors (a
    new rank that must import comm first, to make a live comm group again, reaches them
    late). The survivors keep the grown world and their recovery goes on in a next round
    over it (``rank._recovery``): this process keeps that world too and takes part in
    the round through its engine. Raising here ended it with an error in the middle of
    the recovery, and Open MPI never reported that end to the survivors: the next
    round's shrink waited for it for ever (seen twice, with MPI_ERR_PROC_FAILED and
    MPI_ERR_OTHER from the groups' ``MPI_Comm_create``). (A
    spawn the survivors gave up never sends the keys: that process fails or waits here.)"""
    from mpi4py import MPI

    keys = comm.bcast(None, root=root)
    try:
        replace(comm, keys)
    except MPI.Exception as e:  # a death's error class varies here (PROC_FAILED, ERR_OTHER)
        set_world(comm)  # the survivors' round fails the same collective: they tell it
        # and the job's log keeps this rank's side of it (its engine has not started)
        print(
            f"clusterkernel: new rank {comm.Get_rank()}: re-making comm's groups failed "
            f"({e}); it takes part in the recovery's next round",
            file=sys.stderr,
            flush=True,
        )


def _started() -> float:
    """This process's start, wall clock (Linux: its start in ticks since boot; now
    elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()
    return time.time() - since_boot + ticks / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    # run as the package's module, not as __main__: what it keeps (the phases timed) is
    # then the module's that later code imports
    from clusterkernel.rank import _respawn

    _respawn.main(sys.argv[1:])
