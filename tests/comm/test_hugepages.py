"""Huge-page backing of large communication buffers (engine side, no MPI needed)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from clusterkernel.comm import _hugepages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def test_empty_is_aligned_and_usable():
    arr = _hugepages.empty(3 * 1024 * 1024, np.float32)
    assert arr.ctypes.data % _hugepages.HUGE == 0 and arr.size == 3 * 1024 * 1024
    arr[:] = 1.5
    assert float(arr.sum()) == 1.5 * arr.size
    small = _hugepages.empty(10, np.int64)
    assert small.size == 10


def test_hot_buffer_is_collapsed_on_third_use_without_changing_it():
    if not _hugepages.STATE.enabled:
        pytest.skip("huge pages unavailable here")
    t = torch.arange(3 * 1024 * 1024, dtype=torch.float32)  # 12 MB, torch's allocator
    before = _hugepages.huge_kb(t.data_ptr())
    for _ in range(_hugepages.HOT):
        _hugepages.note_buffer(t.data_ptr(), t.nbytes)
    if not _hugepages.STATE.enabled:
        pytest.skip("MADV_COLLAPSE not supported by this kernel")
    after = _hugepages.huge_kb(t.data_ptr())
    assert after >= before + 8 * 1024, (before, after)  # at least 4 of the ~6 pages
    assert torch.equal(t, torch.arange(3 * 1024 * 1024, dtype=torch.float32))


def test_a_buffer_the_kernel_refuses_leaves_huge_pages_on_for_the_others(tmp_path):
    """A file-backed buffer (like an MPI window or shm_empty memory) is refused with the
    EINVAL an old kernel gives: that buffer stays as it is, later ones still collapse."""
    import ctypes
    import mmap

    first = torch.zeros(3 * 1024 * 1024)
    if not _hugepages.STATE.enabled or not _hugepages.collapse(first.data_ptr(), first.nbytes):
        pytest.skip("MADV_COLLAPSE not supported by this kernel")
    size = 8 * 1024 * 1024
    with open(tmp_path / "backing", "w+b") as f:
        f.truncate(size)
        m = mmap.mmap(f.fileno(), size)
        m[:] = b"x" * size
        address = ctypes.addressof(ctypes.c_char.from_buffer(m))
        assert not _hugepages.collapse(address + 100, 6 * 1024 * 1024)
        assert m[:4] == b"xxxx" and m[-4:] == b"xxxx"
        del address
        m.close()
    assert _hugepages.STATE.enabled  # was turned off for the whole process
    t = torch.arange(3 * 1024 * 1024, dtype=torch.float32)
    assert _hugepages.collapse(t.data_ptr(), t.nbytes)
    # all but the unaligned ends huge now (the kernel may have made them so at the
    # first touch already: the point is that collapse still runs and succeeds)
    assert _hugepages.huge_kb(t.data_ptr()) >= (t.nbytes - (2 << 20)) // 1024
    assert torch.equal(t, torch.arange(3 * 1024 * 1024, dtype=torch.float32))
