"""Split a global batch that does not divide over the ranks, as evenly as possible."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import Sampler

from clusterkernel.partition._order import epoch_permutation


def batch_shares(global_batch: int, size: int) -> list[int]:
    """How many samples of a ``global_batch`` each of ``size`` ranks takes.

    The first ``global_batch % size`` ranks take one more than the others.

    Example::

        batch_shares(64, 3)   # [22, 21, 21]
    """
    base, extra = divmod(global_batch, size)
    return [base + (r < extra) for r in range(size)]


class UnevenBatchSampler(Sampler[list[int]]):
    """This rank's part of every global batch, when the ranks' parts differ in size.

    Each epoch draws one permutation from ``seed + epoch`` (the same on every rank)
    and cuts it into global batches of ``global_batch``; global batch ``k`` is
    dealt round-robin, so rank ``r`` takes its positions ``r, r + size, ...``
    (``22/21/21`` for 64 over 3 ranks). The ranks' ``k``-th batches together are
    exactly the ``k``-th batch one process would draw with the same seed.

    :meth:`weight` is what makes averaging the ranks' mean gradients equal the
    global batch's mean gradient: scale this rank's loss by ``weight(k)`` before
    ``backward``, then average over the ranks (``Trainer`` does it in ``allreduce``
    mode).

    A last global batch with fewer samples than ranks would leave a rank empty:
    ``uneven="pad"`` fills it up to ``size`` with the permutation's first samples,
    ``uneven="drop"`` (or ``drop_last``) drops it. ``drop_last`` drops any short
    last global batch.

    Example::

        sampler = UnevenBatchSampler(1440, 64, size=3, rank=0, seed=0)
        loader = DataLoader(dataset, batch_sampler=sampler)
        sampler.set_epoch(epoch)
        for k, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) * sampler.weight(k)).backward()
    """

    def __init__(
        self,
        n: int,
        global_batch: int,
        size: int,
        rank: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        uneven: str = "pad",
        drop_last: bool = False,
    ):
        if n == 0:
            raise ValueError("the dataset is empty; every rank's shard would be empty.")
        if global_batch < size:
            raise ValueError(
                f"global_batch={global_batch} is smaller than the {size} ranks, so some "
                f"would get no sample; use global_batch >= {size} or fewer ranks."
            )
        self.n, self.global_batch, self.size, self.rank = n, global_batch, size, rank
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        full, tail = divmod(n, global_batch)
        if tail and (drop_last or (tail < size and uneven == "drop")):
            tail = 0
        self.pad = size - tail if 0 < tail < size else 0
        self.sizes = [global_batch] * full + ([tail + self.pad] if tail else [])
        if not self.sizes:
            raise ValueError(
                f"{n} samples make no full global batch of {global_batch} and drop_last "
                "drops the rest; use a smaller global_batch or drop_last=False."
            )

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch``; call it before iterating each epoch."""
        self.epoch = epoch

    def _permutation(self) -> list[int]:
        return epoch_permutation(self.n, self.shuffle, self.seed, self.epoch)

    def __iter__(self) -> Iterator[list[int]]:
        order = self._permutation()
        order += order[: self.pad]
        start = 0
        for count in self.sizes:
            yield order[start + self.rank : start + count : self.size]
            start += count

    def __len__(self) -> int:
        return len(self.sizes)

    def weight(self, k: int) -> float:
        """``size * (this rank's samples) / (global samples)`` in batch ``k`` of the epoch."""
        count = self.sizes[k]
        return self.size * len(range(self.rank, count, self.size)) / count
