"""How much momentum the async mode keeps, without ranks: the plan for each kind of
server rule, and the bad input the option refuses."""

import pytest
import torch

from clusterkernel.train.ps._modes import AsyncMode
from clusterkernel.train.ps._momentum import compensated_momentum, implicit_momentum
from clusterkernel.train.ps._shard import make_rule


def _params():
    return [torch.nn.Parameter(torch.zeros(3))]


def test_sgd_momentum_is_lowered_by_one_minus_one_over_workers():
    opt = torch.optim.SGD(_params(), lr=0.05, momentum=0.9)
    options, plan = compensated_momentum(opt, None, None, workers=3)
    assert plan.implicit == pytest.approx(2 / 3) == pytest.approx(implicit_momentum(3))
    assert options == {"momentum": pytest.approx(0.9 - 2 / 3)}
    # the rule the servers build from it applies the lowered momentum
    rule = make_rule(opt, None, options)(torch.nn.Parameter(torch.zeros(3)))
    assert rule.param_groups[0]["momentum"] == pytest.approx(0.9 - 2 / 3)
    assert opt.param_groups[0]["momentum"] == 0.9  # the user's optimizer is untouched


def test_momentum_below_the_implicit_one_goes_to_zero_even_with_nesterov():
    opt = torch.optim.SGD(_params(), lr=0.05, momentum=0.5, nesterov=True)
    options, plan = compensated_momentum(opt, None, None, workers=4)
    assert plan.explicit == 0.0
    assert options["momentum"] == 0.0 and options["nesterov"] is False
    make_rule(opt, None, options)(torch.nn.Parameter(torch.zeros(3)))  # torch accepts it


def test_explicit_update_options_are_what_gets_compensated():
    opt = torch.optim.Adam(_params())
    options, plan = compensated_momentum(opt, "sgd", {"lr": 0.1, "momentum": 0.8}, workers=2)
    assert options == {"lr": 0.1, "momentum": pytest.approx(0.3)} and plan.requested == 0.8


@pytest.mark.parametrize(
    "opt, update",
    [
        (lambda: torch.optim.SGD(_params(), lr=0.05), None),  # no momentum to lower
        (lambda: torch.optim.Adam(_params()), None),
        (lambda: torch.optim.SGD(_params(), lr=0.05, momentum=0.9), "adam"),
    ],
)
def test_nothing_to_compensate(opt, update):
    assert compensated_momentum(opt(), update, {"lr": 0.1}, workers=3) == ({"lr": 0.1}, None)


def test_bad_input():
    with pytest.raises(ValueError, match="compensate_momentum must be True or False"):
        AsyncMode(compensate_momentum="yes")
    with pytest.raises(ValueError, match="workers must be >= 1"):
        implicit_momentum(0)
