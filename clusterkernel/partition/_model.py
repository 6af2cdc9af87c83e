"""Cut an ``nn.Sequential`` into consecutive stages (model parallelism)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def balance_by_size(model: nn.Sequential, parts: int) -> list[int]:
    """Layer counts per stage that spread the parameter count evenly.

    A greedy cut: walk the layers and close a stage once it holds its share of
    the remaining parameters, keeping at least one layer for each later stage.
    Parameterless layers (activations) count as one parameter so they spread too.

    Example::

        balance_by_size(nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2)), 2)
        # [1, 2]
    """
    layers = list(model)
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}.")
    if parts > len(layers):
        raise ValueError(f"cannot cut {len(layers)} layers into {parts} non-empty stages.")
    cost = [max(1, sum(p.numel() for p in layer.parameters())) for layer in layers]
    balance: list[int] = []
    i = 0
    for stage in range(parts):
        left = parts - stage
        if left == 1:
            balance.append(len(layers) - i)
            break
        target = sum(cost[i:]) / left
        taken, acc = 0, 0
        # take layers while under target, always at least one, leave one per later stage
        while i + taken < len(layers) - (left - 1) and (
            taken == 0 or acc + cost[i + taken] / 2 <= target
        ):
            acc += cost[i + taken]
            taken += 1
        balance.append(taken)
        i += taken
    return balance


def split_sequential(model: nn.Sequential, balance: Sequence[int]) -> list[nn.Sequential]:
    """Cut ``model`` into ``len(balance)`` stages of ``balance[i]`` layers each.

    The stages share the layer objects with ``model`` (no copy).

    Example::

        stages = split_sequential(net, [2, 3])   # layers 0-1, then 2-4
    """
    if not isinstance(model, nn.Sequential):
        raise TypeError(
            f"expected nn.Sequential, got {type(model).__name__}; write the model as a "
            "Sequential of layers to cut it into stages."
        )
    layers = list(model)
    if any(b < 1 for b in balance):
        raise ValueError(f"every stage needs at least one layer, got balance={list(balance)}.")
    if sum(balance) != len(layers):
        raise ValueError(
            f"balance={list(balance)} covers {sum(balance)} layers but the model has {len(layers)}."
        )
    stages, start = [], 0
    for b in balance:
        stages.append(nn.Sequential(*layers[start : start + b]))
        start += b
    return stages
