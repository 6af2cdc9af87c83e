"""Data and model partitioning (engine side).

- :class:`DataPartitioner` fixed random split, ``use(i)`` picks a piece;
- :class:`DistributedSampler` and :func:`distributed_loader` a disjoint shard per
  rank, reshuffled each epoch, sized from the global batch;
- :class:`UnevenBatchSampler` splits a global batch the ranks do not divide
  (22/21/21 for 64 over 3) and weights each rank's share;
- :func:`split_sequential` and :func:`balance_by_size` cut an ``nn.Sequential``
  into pipeline stages.

Example::

    from clusterkernel.partition import distributed_loader
    from clusterkernel.data import digits
    loader = distributed_loader(digits(), global_batch=128, seed=0)
"""

from clusterkernel.partition._data import DataPartitioner, Partition
from clusterkernel.partition._model import balance_by_size, split_sequential
from clusterkernel.partition._sampler import DistributedSampler, distributed_loader, set_epoch
from clusterkernel.partition._uneven import UnevenBatchSampler, batch_shares

__all__ = [
    "DataPartitioner",
    "DistributedSampler",
    "Partition",
    "UnevenBatchSampler",
    "balance_by_size",
    "batch_shares",
    "distributed_loader",
    "set_epoch",
    "split_sequential",
]
