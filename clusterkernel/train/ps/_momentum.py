"""Asynchronous SGD's own momentum, and how much explicit momentum to keep.

Mitliagkas et al. (2016), "Asynchrony begets momentum": with ``W`` workers pushing
gradients to one set of parameters, each gradient is ``W - 1`` updates stale on
average, and the updates behave like SGD with momentum ``1 - 1/W`` added to the
optimizer's own. A user's ``momentum=0.9`` on 3 workers then totals about 1.57,
which diverges. :func:`compensated_momentum` lowers the explicit momentum so that
explicit + implicit stays near what the user asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def implicit_momentum(workers: int) -> float:
    """The momentum asynchrony adds with ``workers`` workers: ``1 - 1/workers``.

    Example::

        implicit_momentum(3)   # 0.667
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return 1.0 - 1.0 / workers


@dataclass(frozen=True)
class MomentumPlan:
    """What the servers apply: ``explicit = max(0, requested - implicit)``."""

    requested: float
    implicit: float
    explicit: float
    workers: int

    def message(self) -> str:
        """The warning a worker shows when the plan lowers the momentum."""
        return (
            f"mode='async' with {self.workers} workers adds an implicit momentum of about "
            f"{self.implicit:.2f} (1 - 1/workers; Mitliagkas et al. 2016), so the servers "
            f"apply momentum {self.explicit:.2f} instead of the optimizer's "
            f"{self.requested:.2f}, so explicit + implicit stays near "
            f"{self.requested:.2f} (with both, training may stay at chance). To apply "
            f"{self.requested:.2f} as given: mode_options={{'compensate_momentum': False}}."
        )


def server_momentum(
    optimizer: torch.optim.Optimizer, update: str | None, options: dict | None
) -> float | None:
    """The SGD momentum the servers' rule would apply, or None if the rule is not SGD."""
    options = options or {}
    if update == "sgd":
        return float(options.get("momentum", 0.0))
    if update is None and isinstance(optimizer, torch.optim.SGD):
        return float(options.get("momentum", optimizer.param_groups[0]["momentum"]))
    return None


def compensated_momentum(
    optimizer: torch.optim.Optimizer, update: str | None, options: dict | None, workers: int
) -> tuple[dict | None, MomentumPlan | None]:
    """``update_options`` for the servers' rule with the momentum lowered, and the plan.

    Returns ``(options, None)`` unchanged when the rule is not SGD or has no momentum.

    Example::

        opts, plan = compensated_momentum(torch.optim.SGD(ps, lr=0.05, momentum=0.9),
                                          None, None, workers=3)
        opts   # {'momentum': 0.233...}; plan.implicit == 0.667
    """
    requested = server_momentum(optimizer, update, options)
    if not requested:
        return options, None
    implicit = implicit_momentum(workers)
    explicit = max(0.0, requested - implicit)
    new = {**(options or {}), "momentum": explicit}
    if explicit == 0.0:
        new["nesterov"] = False  # torch refuses Nesterov without momentum
        new["dampening"] = 0.0
    return new, MomentumPlan(requested, implicit, explicit, workers)
