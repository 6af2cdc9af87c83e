"""Per-rank shards of a dataset, reshuffled every epoch, and the loader built on them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler, TensorDataset

from clusterkernel.partition._order import epoch_permutation
from clusterkernel.partition._uneven import UnevenBatchSampler
from clusterkernel.partition._world import rank_and_size

if TYPE_CHECKING:  # importing comm starts MPI; the data helpers work without it
    from clusterkernel import comm

_UNEVEN = ("pad", "drop")


class DistributedSampler(Sampler[int]):
    """Hand rank ``rank`` of ``size`` a disjoint shard of a dataset of ``n`` samples.

    Each epoch draws one permutation from ``seed + epoch`` (the same on every rank)
    and deals it out round-robin: rank ``r`` takes positions ``r, r + size, ...``.
    So with a per-rank batch ``b``, the ``k``-th batches of all ranks together are
    exactly ``perm[k*b*size : (k+1)*b*size]``, the batch one process would draw
    with the same seed and a global batch of ``b*size``.

    When ``size`` does not divide ``n``: ``uneven="pad"`` repeats the first samples
    of the permutation so every rank gets ``ceil(n/size)``; ``uneven="drop"`` drops
    the tail so every rank gets ``floor(n/size)``. All ranks always get the same
    number of samples, so they run the same number of steps.

    Example::

        sampler = DistributedSampler(dataset, seed=0)
        loader = DataLoader(dataset, batch_size=32, sampler=sampler)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for x, y in loader: ...

    ``rank`` and ``size`` default to :func:`clusterkernel.comm.rank` / ``size``.
    """

    def __init__(
        self,
        data: Dataset | int,
        size: int | None = None,
        rank: int | None = None,
        *,
        shuffle: bool = True,
        seed: int = 0,
        uneven: str = "pad",
        group: comm.Group | None = None,
    ):
        if uneven not in _UNEVEN:
            raise ValueError(f"uneven must be one of {_UNEVEN}, got {uneven!r}.")
        self.rank, self.size = rank_and_size(rank, size, group)
        self.n = data if isinstance(data, int) else len(data)
        self.shuffle = shuffle
        self.seed = seed
        self.uneven = uneven
        self.epoch = 0
        if uneven == "pad":
            self.num_samples = math.ceil(self.n / self.size)
        else:
            self.num_samples = self.n // self.size
        # Every rank computes the same numbers, so every rank raises here together
        # instead of one rank skipping a collective the others wait in.
        if self.num_samples == 0:
            if self.n == 0:
                raise ValueError("the dataset is empty; every rank's shard would be empty.")
            raise ValueError(
                f"{self.n} samples over {self.size} ranks with uneven='drop' leaves every "
                "rank's shard empty (ranks 0.."
                f"{self.size - 1}). Use uneven='pad', fewer ranks, or more data."
            )
        self.total_size = self.num_samples * self.size

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch``; call it before iterating each epoch."""
        self.epoch = epoch

    def _permutation(self) -> list[int]:
        return epoch_permutation(self.n, self.shuffle, self.seed, self.epoch)

    def __iter__(self) -> Iterator[int]:
        order = self._permutation()
        if self.total_size > self.n:
            reps = math.ceil(self.total_size / self.n)
            order = (order * reps)[: self.total_size]
        else:
            order = order[: self.total_size]
        return iter(order[self.rank : self.total_size : self.size])

    def __len__(self) -> int:
        return self.num_samples


def distributed_loader(
    data: Dataset,
    global_batch: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    uneven: str = "pad",
    drop_last: bool = False,
    size: int | None = None,
    rank: int | None = None,
    group: comm.Group | None = None,
    **loader_kwargs: Any,
) -> DataLoader:
    """This rank's :class:`~torch.utils.data.DataLoader` for a global batch size.

    The per-rank batch is ``global_batch // size``. When the ranks do not divide
    ``global_batch`` (64 over 3), it is split as evenly as possible (22/21/21) by an
    :class:`~clusterkernel.partition.UnevenBatchSampler` (``loader.batch_sampler``):
    its ``weight(k)`` scales each rank's loss so that averaging the ranks' gradients
    still gives the global batch's gradient (``Trainer`` does this in ``allreduce``
    mode). ``drop_last`` drops a short last batch.
    Extra keyword arguments go to ``DataLoader``. For a ``TensorDataset`` each
    batch is one indexing operation (no per-sample collation), which is several
    times faster for small samples.

    Example::

        from clusterkernel.partition import set_epoch
        loader = distributed_loader(digits(), global_batch=128, seed=0)
        for epoch in range(3):
            set_epoch(loader, epoch)      # a new shuffle each epoch (Trainer does this)
            for x, y in loader: ...
    """
    sampler = DistributedSampler(
        data, size, rank, shuffle=shuffle, seed=seed, uneven=uneven, group=group
    )
    if global_batch < 1:
        raise ValueError(f"global_batch must be positive, got {global_batch}.")
    # A DataLoader draws a seed for its workers each time it is iterated, from the
    # global RNG unless given a generator: that would shift dropout's draws by one
    # per epoch, and a run resumed mid-epoch would draw different masks.
    loader_kwargs.setdefault("generator", torch.Generator().manual_seed(seed))
    if global_batch % sampler.size:
        uneven_batches = UnevenBatchSampler(
            sampler.n, global_batch, sampler.size, sampler.rank, shuffle=shuffle,
            seed=seed, uneven=uneven, drop_last=drop_last,
        )  # fmt: skip
        if isinstance(data, TensorDataset) and not loader_kwargs.get("collate_fn"):
            return DataLoader(data, batch_size=None, sampler=uneven_batches, **loader_kwargs)
        return DataLoader(data, batch_sampler=uneven_batches, **loader_kwargs)
    per_rank = global_batch // sampler.size
    if isinstance(data, TensorDataset) and not loader_kwargs.get("collate_fn"):
        batches = BatchSampler(sampler, per_rank, drop_last)
        return DataLoader(data, batch_size=None, sampler=batches, **loader_kwargs)
    return DataLoader(
        data, batch_size=per_rank, sampler=sampler, drop_last=drop_last, **loader_kwargs
    )


def set_epoch(loader: Iterable, epoch: int) -> bool:
    """Call ``set_epoch`` on the sampler behind ``loader`` (if it has one).

    Finds it whether it is the loader's sampler, its batch sampler's, or wrapped
    in a ``BatchSampler``. Returns whether one was found.

    Example::

        for epoch in range(3):
            set_epoch(loader, epoch)     # a new shuffle, the same on every rank
            for x, y in loader: ...
    """
    candidates = [
        getattr(loader, "sampler", None),
        getattr(getattr(loader, "sampler", None), "sampler", None),
        getattr(getattr(loader, "batch_sampler", None), "sampler", None),
        getattr(loader, "batch_sampler", None),
    ]
    for s in candidates:
        if hasattr(s, "set_epoch"):
            s.set_epoch(epoch)
            return True
    return False
