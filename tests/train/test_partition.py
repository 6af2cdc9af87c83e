"""DataPartitioner, DistributedSampler, distributed_loader and the Sequential splitter.

These are pure functions of (rank, size, seed), so they are checked here for every
rank in one process; the MPI tests check them again under real ranks.
"""

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from clusterkernel.partition import (
    DataPartitioner,
    DistributedSampler,
    balance_by_size,
    batch_shares,
    distributed_loader,
    set_epoch,
    split_sequential,
)


def test_partitioner_disjoint_cover_and_seeded():
    data = list(range(103))
    parts = DataPartitioner(data, [1 / 3] * 3, seed=7)
    got = [list(parts.use(i)) for i in range(3)]
    assert sorted(sum(got, [])) == data  # disjoint and nothing dropped
    assert [len(g) for g in got] == [35, 34, 34]
    again = DataPartitioner(data, [1 / 3] * 3, seed=7)
    assert [list(again.use(i)) for i in range(3)] == got
    other = DataPartitioner(data, [1 / 3] * 3, seed=8)
    assert [list(other.use(i)) for i in range(3)] != got


def test_partitioner_counts_fractions_and_errors():
    parts = DataPartitioner(list(range(10)), [0.7, 0.2, 0.1])
    assert parts.lengths == [7, 2, 1]
    assert DataPartitioner(list(range(10)), [6, 3]).lengths == [6, 3]
    with pytest.raises(ValueError, match=r"partition\(s\) \[2\] would be empty"):
        DataPartitioner(list(range(2)), [0.5, 0.5, 0.0])
    with pytest.raises(ValueError, match="add up to"):
        DataPartitioner(list(range(10)), [0.7, 0.7])
    with pytest.raises(ValueError, match="only 10"):
        DataPartitioner(list(range(10)), [8, 8])
    with pytest.raises(IndexError, match="there are 3"):
        parts.use(3)


@pytest.mark.parametrize("n,size", [(10, 3), (12, 4), (7, 2), (2, 3)])
def test_sampler_pad_covers_everything_equally(n, size):
    shards = [list(DistributedSampler(n, size, r, seed=3)) for r in range(size)]
    lengths = {len(s) for s in shards}
    assert lengths == {-(-n // size)}
    assert set(sum(shards, [])) == set(range(n))


@pytest.mark.parametrize("n,size", [(10, 3), (12, 4), (7, 2)])
def test_sampler_drop_is_disjoint(n, size):
    shards = [DistributedSampler(n, size, r, seed=3, uneven="drop") for r in range(size)]
    flat = sum((list(s) for s in shards), [])
    assert len(flat) == len(set(flat)) == (n // size) * size
    assert all(len(s) == n // size for s in shards)


def test_sampler_reshuffles_per_epoch_same_on_all_ranks():
    a, b = DistributedSampler(40, 2, 0, seed=1), DistributedSampler(40, 2, 1, seed=1)
    e0 = list(a)
    a.set_epoch(1)
    b.set_epoch(1)
    e1 = list(a)
    assert e0 != e1
    assert set(e1).isdisjoint(list(b))
    a.set_epoch(0)
    assert list(a) == e0
    assert list(DistributedSampler(40, 2, 0, shuffle=False)) == list(range(0, 40, 2))


def test_sampler_empty_shard_is_an_error():
    with pytest.raises(ValueError, match="every rank's shard empty"):
        DistributedSampler(2, 3, 0, uneven="drop")
    with pytest.raises(ValueError, match="dataset is empty"):
        DistributedSampler(0, 2, 1)
    with pytest.raises(ValueError, match="uneven must be"):
        DistributedSampler(10, 2, 0, uneven="wrap")
    with pytest.raises(ValueError, match="outside 0..1"):
        DistributedSampler(10, 2, 2)


def test_loader_batches_union_equals_single_process_batches():
    """The k-th batches of all ranks together are the single process's k-th batch."""
    ds = TensorDataset(torch.arange(64))
    single = [b[0].tolist() for b in distributed_loader(ds, 16, seed=5, size=1, rank=0)]
    per_rank = [
        [b[0].tolist() for b in distributed_loader(ds, 16, seed=5, size=4, rank=r)]
        for r in range(4)
    ]
    assert all(len(p) == len(single) == 4 for p in per_rank)
    for k, batch in enumerate(single):
        assert all(len(p[k]) == 4 for p in per_rank)
        assert sorted(sum((p[k] for p in per_rank), [])) == sorted(batch)


@pytest.mark.parametrize("dataset", ["tensors", "samples"])
def test_iterating_a_loader_leaves_the_global_rng_alone(dataset):
    # dropout draws from the global RNG; a loader must not (a resumed run would differ)
    ds = TensorDataset(torch.arange(64))
    if dataset == "samples":
        ds = [(torch.tensor(i), i % 2) for i in range(64)]  # a plain sequence of samples
    torch.manual_seed(5)
    before = torch.get_rng_state()
    for _ in range(2):  # two epochs: a new iterator each
        for _batch in distributed_loader(ds, 16, seed=1, size=2, rank=0):
            pass
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("dataset", ["tensors", "samples"])
def test_uneven_global_batch_is_split_as_evenly_as_possible(dataset):
    """64 over 3 ranks: 22/21/21, and together still the single process's batches."""
    ds = TensorDataset(torch.arange(150))
    if dataset == "samples":
        ds = [(torch.tensor(i),) for i in range(150)]  # per-sample collation path
    single = [b[0].tolist() for b in distributed_loader(ds, 64, seed=5, size=1, rank=0)]
    loaders = [distributed_loader(ds, 64, seed=5, size=3, rank=r) for r in range(3)]
    per_rank = [[b[0].tolist() for b in loader] for loader in loaders]
    assert [len(b) for b in single] == [64, 64, 22]
    assert [[len(b) for b in p] for p in per_rank] == [[22, 22, 8], [21, 21, 7], [21, 21, 7]]
    assert batch_shares(64, 3) == [22, 21, 21]
    for k, batch in enumerate(single):
        assert sorted(sum((p[k] for p in per_rank), [])) == sorted(batch)
        # the weights turn the ranks' mean gradients into the global batch's mean
        weights = [_weighter(loader)(k) for loader in loaders]
        # (averaging w_r * mean_r over 3 ranks = sum of the samples' gradients / batch)
        assert weights == pytest.approx([3 * len(p[k]) / len(batch) for p in per_rank])
        assert sum(weights) == pytest.approx(3)
    assert set_epoch(loaders[0], 1)
    assert [b[0].tolist() for b in loaders[0]] != per_rank[0]  # reshuffled


def _weighter(loader):
    sampler = loader.batch_sampler or loader.sampler
    return sampler.weight


def test_uneven_global_batch_last_batch_smaller_than_the_ranks():
    ds = TensorDataset(torch.arange(66))  # 64 + 2: the last global batch has 2 samples
    pad = [[len(b[0]) for b in distributed_loader(ds, 64, size=3, rank=r)] for r in range(3)]
    assert pad == [[22, 1], [21, 1], [21, 1]]  # padded to one sample per rank
    drop = distributed_loader(ds, 64, size=3, rank=2, uneven="drop")
    assert [len(b[0]) for b in drop] == [21]
    with pytest.raises(ValueError, match="smaller than the 3 ranks"):
        distributed_loader(ds, 2, size=3, rank=0)


def test_split_sequential_and_balance():
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    stages = split_sequential(net, [2, 3])
    assert [len(s) for s in stages] == [2, 3]
    assert stages[1][0] is net[2]
    x = torch.randn(3, 4)
    assert torch.equal(stages[1](stages[0](x)), net(x))
    with pytest.raises(ValueError, match="covers 4 layers but the model has 5"):
        split_sequential(net, [2, 2])
    with pytest.raises(TypeError, match="Sequential"):
        split_sequential(nn.Linear(2, 2), [1])
    wide = nn.Sequential(nn.Linear(100, 100), nn.Linear(100, 1), nn.Linear(1, 1), nn.Linear(1, 1))
    assert balance_by_size(wide, 2) == [1, 3]
    assert sum(balance_by_size(net, 3)) == 5 and min(balance_by_size(net, 3)) >= 1
    with pytest.raises(ValueError, match="non-empty stages"):
        balance_by_size(net, 6)
