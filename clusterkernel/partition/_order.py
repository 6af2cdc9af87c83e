"""The order samples are visited in, shared by the samplers (engine side)."""

from __future__ import annotations

import torch


def epoch_permutation(n: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The order of ``n`` samples in ``epoch``: the same on every rank (seeded), or 0..n-1."""
    if shuffle:
        gen = torch.Generator().manual_seed(seed + epoch)
        return torch.randperm(n, generator=gen).tolist()
    return list(range(n))
