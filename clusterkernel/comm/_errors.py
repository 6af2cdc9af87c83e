"""Exceptions raised by the comm layer."""

from __future__ import annotations


class CommError(RuntimeError):
    """A communication call cannot proceed (e.g. this rank is not in the group)."""


class CollectiveMismatchError(CommError):
    """Check mode found ranks that entered different collectives (or shapes/dtypes/ops).

    Raised on every rank of the group, naming the ranks that differ.
    """
