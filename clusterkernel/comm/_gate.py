"""The generation of what the C path's admission of a plan depends on beyond the plan.

:func:`~._plan.admit` decides, after a Python call of a plan, whether the C path may
take its next calls, and stamps that answer with :data:`GATE`'s generation. What it
read besides the plan (the check mode, forced staging, a group's agreed set) lives in
modules :mod:`._plan` imports, so they move the generation on through this leaf module
(:func:`changed`): the C path then finds every answer stale and hands the next call of
each plan to Python, which decides again.

Example::

    from clusterkernel.comm import _gate
    _gate.changed()   # after changing something admit() reads
"""

from __future__ import annotations


class _Gate:
    """One counter, read by name in C (``_fast.c``) and by :func:`~._plan.admit`."""

    __slots__ = ("stamp",)

    def __init__(self) -> None:
        self.stamp = 0


GATE = _Gate()


def changed() -> None:
    """Something :func:`~._plan.admit` reads changed: every plan's answer is stale."""
    GATE.stamp += 1
