"""Runs once on every engine right after (re)start (engine side).

Reports the engine's MPI rank, host and pid so the client can build its rank map,
and arms ``faulthandler`` on SIGUSR1 so the client can ask a rank for its Python
stack even while that rank's main thread is blocked inside an MPI call (the C-level
handler runs without the GIL holder's cooperation).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket

STACK_SIGNAL = signal.SIGUSR1

_stack_file = None


def stack_path(stack_dir: str, rank: int) -> str:
    return os.path.join(stack_dir, f"stack-rank{rank}.txt")


def setup(stack_dir: str) -> dict:
    """Arm the stack dump and return this engine's identity."""
    global _stack_file
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    if _stack_file is None:
        # Kept open for the engine's life: faulthandler writes to the fd from a
        # signal handler, where opening a file is not allowed.
        _stack_file = open(stack_path(stack_dir, rank), "w")  # noqa: SIM115
        faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
    return {
        "rank": rank,
        "size": world.Get_size(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
