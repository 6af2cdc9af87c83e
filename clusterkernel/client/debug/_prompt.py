"""``%mpi debug``: a pdb prompt for several ranks at once (client side).

The magic's parser is in :mod:`clusterkernel.client.magics._args`; this is its prompt loop
over a :class:`~clusterkernel.client.debug.DebugSession`. ``input()`` asks for each
command (a text box in the notebook), every rank of the session answers, and
identical answers show once under their ranks.

Example::

    run_debug(cluster.debug([1, 3]), command="p x")   # [rank 1] 10 / [rank 3] 30
    run_debug(cluster.debug([1, 3]))                  # (Pdb ranks 1,3) ... until q
"""

from __future__ import annotations

from IPython.core.error import UsageError

from clusterkernel.client.debug import DebugSession
from clusterkernel.client.errors import format_ranks, rank_label

_END = {"q", "quit", "exit"}


def describe(session: DebugSession) -> str:
    """One line per kind of rank in the session: what is debugged there."""
    lines = []
    for rank in session.ranks:
        kind = session.state[rank]
        if kind == "breakpoint":
            lines.append(f"[rank {rank}] stopped at breakpoint(); c lets it run on")
        elif kind == "post-mortem":
            lines.append(f"[rank {rank}] post-mortem of {session.errors.get(rank, 'its error')}")
        else:
            lines.append(f"[rank {rank}] nothing to debug (no traceback, no breakpoint)")
    return "\n".join(lines)


def run_debug(session: DebugSession, command: str | None = None) -> None:
    """Send ``command`` and print the answers; without one, a prompt until ``q``."""
    with session:
        if command is not None:
            _print(session.send(command))
            return
        print(describe(session))
        prompt = f"(Pdb {rank_label(session.ranks)}) "
        while True:
            try:
                line = input(prompt)
            except EOFError:
                break
            except (NotImplementedError, OSError):  # IPython's StdinNotImplementedError
                raise UsageError(
                    "This front end sends no input: use %mpi debug -c 'p x' "
                    "(or cluster.debug(...).send('p x') in Python)."
                ) from None
            if line.strip() in _END:
                break
            _print(session.send(line))
        paused = [r for r, kind in session.state.items() if kind == "breakpoint"]
        if paused:
            print(
                f"Rank {format_ranks(paused)} stays stopped at breakpoint(): "
                f'%mpi debug --ranks {format_ranks(paused)} -c "c" lets it run on.'
            )


def _print(answers) -> None:
    text = str(answers)
    if text.strip():
        print(text)
