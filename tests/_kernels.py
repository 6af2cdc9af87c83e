"""Real Jupyter kernels for the tests that drive the magics as a notebook does, and
waits on a condition in place of sleeps.

Example::

    from tests._kernels import kernel

    def test_x(no_shared_cluster):
        with kernel() as (km, kc):
            kc.execute_interactive("%load_ext clusterkernel", timeout=60)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from jupyter_client import KernelManager


@contextmanager
def kernel(name: str = "python3", ready_timeout: float = 60) -> Iterator[tuple]:
    """A started kernel and its client with channels open: ``(km, kc)``. On the way out
    the channels close and the kernel is shut down, or, where the test killed it, its
    resources (connection file, ports) are released."""
    km = KernelManager(kernel_name=name)
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=ready_timeout)
        yield km, kc
    finally:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=False)
        else:
            km.cleanup_resources()


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> object:
    """Poll ``condition`` until it returns something true (returned), or fail after
    ``timeout`` seconds saying ``what`` was awaited: a deadline for a failure, never a
    measure of speed."""
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.05)


def wait_for_files(paths: list[Path], timeout: float = 60) -> None:
    """Wait until every one of ``paths`` exists (ranks touch them to say "here now")."""
    wait_until(lambda: all(p.exists() for p in paths), timeout, f"{[str(p) for p in paths]}")
