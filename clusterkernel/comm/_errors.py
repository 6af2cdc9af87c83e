"""Exceptions raised by the comm layer."""

from __future__ import annotations

from collections.abc import Iterable

from mpi4py import MPI

from clusterkernel.protocol._errors import ClusterkernelError


class CommError(ClusterkernelError, RuntimeError):
    """A communication call cannot proceed (e.g. this rank is not in the group)."""


class CollectiveMismatchError(CommError):
    """Check mode found ranks that entered different collectives (or shapes/dtypes/ops).

    Raised on every rank of the group, naming the ranks that differ.
    """


# the error classes by which a fault-tolerant MPI (ULFM) says a peer is gone
_FAILURE_CLASSES = frozenset(
    getattr(MPI, name)
    for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
    if hasattr(MPI, name)
)


class _MPIError(MPI.Exception):
    """``MPI.Exception`` as comm's C path (all_reduce) raises it: a peer's death comes
    out as :class:`PeerDiedError`, every other error as the plain MPI error."""

    def __new__(cls, code: int = MPI.ERR_OTHER, *args, **kwargs):
        if cls is _MPIError and is_failure(code):
            died = super().__new__(PeerDiedError, code)
            died._op = "all_reduce"  # the one call the C path makes
            return died
        return super().__new__(cls, code)

    def __init__(self, code: int = MPI.ERR_OTHER, *args, **kwargs) -> None:
        super().__init__(code)


# what users read in a traceback of any other MPI error: mpi4py's own name
_MPIError.__name__ = _MPIError.__qualname__ = "Exception"
_MPIError.__module__ = "mpi4py.MPI"


class PeerDiedError(CommError, _MPIError):
    """A call found a peer rank dead (a ``--fault-tolerant`` job): it cannot complete.

    ``op`` names the call ("all_reduce"), ``dead`` the ranks known dead (may be empty
    where MPI has not said which). It is an ``MPI.Exception`` too (error class
    ``MPI.ERR_PROC_FAILED``), so code written for mpi4py's errors still catches it.
    With ``%mpi start --respawn`` the notebook replaces the dead rank; a loop under
    :func:`clusterkernel.train.steps` (and ``Trainer.fit``) redoes the
    step on the N ranks again.

    Example::

        try:
            comm.all_reduce(t)
        except comm.PeerDiedError as e:
            print(e.op, e.dead)        # all_reduce [2]
    """

    def __init__(
        self, code: int = MPI.ERR_PROC_FAILED, op: str = "", dead: Iterable[int] = ()
    ) -> None:
        """``code``: MPI's error class; ``op``: the call that failed; ``dead``: the dead
        ranks (asked of MPI when not given)."""
        super().__init__(code)
        self.op = op or getattr(self, "_op", "")
        self.dead = sorted(dead) if dead else _known_dead()

    def __str__(self) -> str:
        who = f"rank {','.join(map(str, self.dead))} died" if self.dead else "a peer rank died"
        return f"{self.op or 'a collective'} failed: {who}"

    def __reduce__(self):
        return (type(self), (self.Get_error_code(), self.op, self.dead))


def is_failure(code_or_exc: int | BaseException) -> bool:
    """Whether an MPI error (code or exception) says a peer has died."""
    if isinstance(code_or_exc, PeerDiedError):
        return True
    if isinstance(code_or_exc, MPI.Exception):
        code = code_or_exc.Get_error_class()
    elif isinstance(code_or_exc, int):
        try:
            code = MPI.Get_error_class(code_or_exc)
        except MPI.Exception:
            return False
    else:
        return False
    return code in _FAILURE_CLASSES


def peer_died(exc: BaseException, op: str) -> BaseException:
    """``exc`` as the caller should see it: :class:`PeerDiedError` for a peer's death (named
    ``op``), else ``exc`` itself."""
    if isinstance(exc, PeerDiedError):
        if not exc.op:
            exc.op = op
        return exc
    if is_failure(exc):
        return PeerDiedError(exc.Get_error_code(), op)
    return exc


def _known_dead() -> list[int]:
    """The world's ranks this process has learnt are dead (ULFM), or [] where it cannot say."""
    try:
        from clusterkernel.protocol._engine import world

        comm = world()
        failed = comm.Get_failed()
        try:
            ranks = MPI.Group.Translate_ranks(
                failed, list(range(failed.Get_size())), comm.Get_group()
            )
        finally:
            failed.Free()
        return sorted(r for r in ranks if r != MPI.UNDEFINED)
    except Exception:  # no ULFM in this MPI, or the world is gone: unknown
        return []
