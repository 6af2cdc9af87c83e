"""The Trainer's background batch loader (threads only; no MPI needed)."""

import threading
import time

import pytest
import torch

from clusterkernel.partition import distributed_loader
from clusterkernel.train import Prefetcher


def test_yields_everything_in_order():
    ds = torch.utils.data.TensorDataset(torch.arange(50.0), torch.arange(50))
    loader = distributed_loader(ds, 8, seed=1, size=1, rank=0)
    with Prefetcher(loader, depth=3) as batches:
        got = [y.tolist() for _, y in batches]
    assert got == [y.tolist() for _, y in loader]


def test_loads_ahead_while_consumer_works():
    loaded = []

    def slow_source():
        for i in range(4):
            time.sleep(0.05)
            loaded.append(i)
            yield i

    with Prefetcher(slow_source(), depth=2) as items:
        it = iter(items)
        assert next(it) == 0
        time.sleep(0.2)  # "compute": meanwhile the thread loads the next items
        assert len(loaded) >= 3
        assert list(it) == [1, 2, 3]


def test_error_in_loader_reaches_consumer():
    def broken():
        yield 1
        raise OSError("disk gone")

    with Prefetcher(broken()) as items:
        it = iter(items)
        assert next(it) == 1
        with pytest.raises(OSError, match="disk gone"):
            next(it)


def test_close_stops_thread_of_endless_source():
    def endless():
        i = 0
        while True:
            i += 1
            yield i

    before = threading.active_count()
    with Prefetcher(endless(), depth=1) as items:
        for i in items:
            if i == 5:
                break
    assert threading.active_count() == before
    with pytest.raises(ValueError, match="depth"):
        Prefetcher([], depth=0)


def test_spare_core_counts_ranks_and_threads(monkeypatch):
    import os

    from clusterkernel.train import spare_core

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        cores = len(os.sched_getaffinity(0))
        monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1")
        assert spare_core() == (cores >= 2)
        monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", str(cores))
        assert not spare_core()  # every core already runs a rank
        monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE")
        assert not spare_core(ranks_fallback=cores)
    finally:
        torch.set_num_threads(threads)
