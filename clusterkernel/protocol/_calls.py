"""The names of comm's collective calls, which both sides must spell alike.

A rank's mismatch check codes a call by its place in :data:`CHECKED_CALLS` (so a
rank can name a call it did not make itself; append, never reorder); the
notebook's hang report reads :data:`SIZED_CALLS` to tell whether ranks waiting in
one call with different sizes are a mismatch.
"""

from __future__ import annotations

# Every checked call, in the order of its code.
CHECKED_CALLS = (
    "barrier",
    "broadcast",
    "reduce",
    "all_reduce",
    "scatter",
    "gather",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "all_reduce_coalesced",
    "broadcast_object",
    "broadcast_object_list",
    "gather_object",
    "all_gather_object",
    "scatter_object_list",
)

# Calls whose size must be the same on every member: all but the barrier (no size),
# the all-to-alls and the object calls (their sizes may differ per rank).
SIZED_CALLS = frozenset(CHECKED_CALLS) - {
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "broadcast_object",
    "broadcast_object_list",
    "gather_object",
    "all_gather_object",
    "scatter_object_list",
}
