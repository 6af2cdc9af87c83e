"""A plan's admission to the C fast path (comm._plan.admit, comm._gate), in one process:
what the C path would read of a plan at every moment admit() may hand the GIL over."""

from __future__ import annotations

import torch

from clusterkernel.comm import _plan
from clusterkernel.comm._gate import GATE, changed
from clusterkernel.comm._groups import WORLD, Group


class _SeenSet(set):
    """A group's agreed set that notes, on each look-up, what the C path would do now."""

    def __init__(self, plan: _plan.Plan) -> None:
        super().__init__()
        self.plan, self.c_would_run = plan, []

    def __contains__(self, key) -> bool:
        p = self.plan
        self.c_would_run.append(p.stamp == GATE.stamp and p.fast is not None)
        return super().__contains__(key)


def test_no_moment_of_admit_shows_an_old_answer_as_current():
    g = Group(WORLD.comm, WORLD.ranks, "gate-test")
    plan = _plan.Plan(
        g,
        "all_reduce",
        None,
        None,
        size=16,
        dtype=torch.float32,
        numel=4,
        direct=True,
        handles=(1, 2, 3),
    )
    g._sigs.add(plan.sig)
    _plan.admit(g, plan)  # agreed: the C path takes the plan's calls
    assert plan.fast == (1, 2, 3) and plan.stamp == GATE.stamp
    # the agreed set starts afresh (what _check.agree does when full), the gate moves
    seen = g._sigs = _SeenSet(plan)
    g._sig_gen += 1
    changed()
    _plan.admit(g, plan)  # a check is due again: no C path, at any moment
    assert seen.c_would_run == [False] and plan.fast is None
