"""Where this rank sits: rank and size, from the comm layer unless given."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing comm starts MPI; the data helpers work without it
    from clusterkernel import comm


def rank_and_size(
    rank: int | None, size: int | None, group: comm.Group | None = None
) -> tuple[int, int]:
    """Return ``(rank, size)``, asking :mod:`clusterkernel.comm` only for what is missing.

    Explicit values let the data helpers run without MPI (one process, or tests).
    """
    if rank is None or size is None:
        from clusterkernel import comm

        if rank is None:
            rank = comm.rank(group)
        if size is None:
            size = comm.size(group)
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}.")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside 0..{size - 1}.")
    return rank, size
