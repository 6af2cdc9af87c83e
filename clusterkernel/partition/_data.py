"""Fixed random split of a dataset into disjoint pieces (the PyTorch tutorial's shape)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import Dataset


class Partition(Dataset):
    """A view of ``data`` restricted to ``indices`` (no copy of the samples).

    Example::

        evens = Partition(dataset, range(0, len(dataset), 2))
        x, y = evens[1]                  # dataset[2]
    """

    def __init__(self, data: Dataset, indices: Sequence[int]):
        self.data = data
        self.indices = list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.data[self.indices[i]]


def _lengths(n: int, sizes: Sequence[float | int]) -> list[int]:
    if not sizes:
        raise ValueError("sizes is empty; give one fraction (or count) per partition.")
    if any(s < 0 for s in sizes):
        raise ValueError(f"sizes must be non-negative, got {list(sizes)}.")
    if all(isinstance(s, int) for s in sizes):
        if sum(sizes) > n:
            raise ValueError(f"sizes ask for {sum(sizes)} samples but the data has only {n}.")
        return list(sizes)
    total = float(sum(sizes))
    if total > 1.0 + 1e-9:
        raise ValueError(f"fractions in sizes add up to {total:.6g} > 1.")
    lengths = [int(s * n) for s in sizes]
    # Fractions that cover the whole set should not silently drop the rounding
    # remainder: hand it out one sample at a time from the first partition on.
    if abs(total - 1.0) <= 1e-9:
        for i in range(n - sum(lengths)):
            lengths[i % len(lengths)] += 1
    return lengths


class DataPartitioner:
    """Shuffle ``data`` once with ``seed`` and cut it into disjoint partitions.

    ``sizes`` holds fractions of the data (``[0.5, 0.5]``) or sample counts
    (``[600, 400]``). Every rank that builds a partitioner with the same seed gets
    the same split, so ``use(comm.rank())`` hands each rank its own piece.

    Example::

        sizes = [1.0 / comm.size()] * comm.size()
        shard = DataPartitioner(dataset, sizes, seed=1234).use(comm.rank())
        loader = DataLoader(shard, batch_size=32, shuffle=True)

    An empty partition is an error at construction, on every rank alike, because a
    rank with no data would leave the others waiting in a collective.
    """

    def __init__(
        self, data: Dataset, sizes: Sequence[float | int] = (0.7, 0.2, 0.1), seed: int = 1234
    ):
        self.data = data
        n = len(data)
        self.lengths = _lengths(n, sizes)
        empty = [i for i, k in enumerate(self.lengths) if k == 0]
        if empty:
            raise ValueError(
                f"partition(s) {empty} would be empty: {n} samples split by sizes "
                f"{list(sizes)} gives lengths {self.lengths}. Use fewer partitions or "
                "more data."
            )
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(n, generator=gen).tolist()
        self.partitions: list[list[int]] = []
        start = 0
        for k in self.lengths:
            self.partitions.append(perm[start : start + k])
            start += k

    def __len__(self) -> int:
        return len(self.partitions)

    def use(self, i: int) -> Partition:
        """The ``i``-th partition as a dataset."""
        if not 0 <= i < len(self.partitions):
            raise IndexError(f"partition {i} does not exist; there are {len(self.partitions)}.")
        return Partition(self.data, self.partitions[i])
