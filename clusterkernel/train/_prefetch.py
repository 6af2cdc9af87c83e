"""Load the next batch in a background thread while the current one computes."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any

_END = object()
_LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE")


def spare_core(ranks_fallback: int = 1) -> bool:
    """Whether a loader thread would get a core of its own on this machine.

    True when the cores this process may use cover every rank on the node with
    its torch threads plus one. Without a spare core the thread only competes
    with compute (BENCHMARKS.md, "Synchronous data-parallel training"). The ranks per
    node come from the MPI launcher's environment, else ``ranks_fallback``.

    ``Trainer(..., prefetch="auto")`` asks it.

    Example::

        spare_core()   # e.g. False: 4 ranks of one torch thread each on 2 cores
    """
    import torch

    local = ranks_fallback
    for var in _LOCAL_SIZE_VARS:
        if os.environ.get(var, "").isdigit():
            local = int(os.environ[var])
            break
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores >= local * (torch.get_num_threads() + 1)


class Prefetcher:
    """Iterate ``iterable`` in a thread, keeping up to ``depth`` items ready.

    A thread rather than DataLoader worker processes: forking an MPI rank is
    unsafe, and torch's batch indexing and collation release the GIL for the
    copying, so the thread overlaps the main thread's compute. An error in the
    thread is raised in the consumer. Use it as a context manager so the thread
    stops when the loop ends early.

    Example::

        with Prefetcher(loader) as batches:
            for x, y in batches:
                ...
    """

    def __init__(self, iterable: Iterable, depth: int = 2):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}.")
        self._q: queue.Queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(iterable,), name="clusterkernel-prefetch", daemon=True
        )
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, iterable: Iterable) -> None:
        try:
            for item in iterable:
                if not self._put((True, item)):
                    return
            self._put((False, _END))
        except BaseException as exc:  # handed to the consumer, raised there
            self._put((False, exc))

    def __iter__(self) -> Iterator:
        while True:
            ok, item = self._q.get()
            if ok:
                yield item
            elif item is _END:
                return
            else:
                raise item

    def close(self) -> None:
        """Stop the thread (it finishes the item it is loading) and wait for it."""
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
