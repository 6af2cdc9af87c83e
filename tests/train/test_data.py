"""Example data sets and the MNIST idx reader (on tiny files the test writes)."""

import gzip
import struct

import numpy as np
import pytest
import torch

from clusterkernel.data import digits, mnist, read_idx, teacher


def _write_idx(path, array: np.ndarray, code: int = 0x08, opener=open):
    # Written by hand from the format spec, independent of the reader under test.
    with opener(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, code, array.ndim))
        f.write(struct.pack(">" + "I" * array.ndim, *array.shape))
        f.write(array.astype(array.dtype.newbyteorder(">")).tobytes())


def test_digits_real_data():
    ds = digits()
    x, y = ds.tensors
    assert x.shape == (1797, 64) and x.dtype == torch.float32
    assert 0.0 <= x.min() and x.max() <= 1.0
    assert set(y.tolist()) == set(range(10))
    assert digits(flatten=False).tensors[0].shape == (1797, 1, 8, 8)


def test_teacher_is_deterministic_and_learnable_shape():
    a, b = teacher(256, 20, 5, seed=3), teacher(256, 20, 5, seed=3)
    assert torch.equal(a.tensors[0], b.tensors[0]) and torch.equal(a.tensors[1], b.tensors[1])
    assert not torch.equal(teacher(256, 20, 5, seed=4).tensors[1], a.tensors[1])
    assert len(set(a.tensors[1].tolist())) > 1
    with pytest.raises(ValueError, match="classes >= 2"):
        teacher(10, 4, 1)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_from_tiny_idx_files(tmp_path, gz):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    suffix, opener = (".gz", gzip.open) if gz else ("", open)
    _write_idx(tmp_path / f"train-images-idx3-ubyte{suffix}", images, opener=opener)
    _write_idx(tmp_path / f"train-labels-idx1-ubyte{suffix}", labels, opener=opener)
    # the magic numbers the format promises for MNIST
    with opener(tmp_path / f"train-images-idx3-ubyte{suffix}", "rb") as f:
        assert struct.unpack(">I", f.read(4))[0] == 2051
    with opener(tmp_path / f"train-labels-idx1-ubyte{suffix}", "rb") as f:
        assert struct.unpack(">I", f.read(4))[0] == 2049

    ds = mnist(tmp_path)
    x, y = ds.tensors
    assert x.shape == (5, 1, 28, 28) and x.dtype == torch.float32
    assert torch.allclose(x[2, 0], torch.from_numpy(images[2].astype(np.float32) / 255))
    assert y.tolist() == [3, 1, 4, 1, 5]
    assert mnist(tmp_path, flatten=True).tensors[0].shape == (5, 784)
    with pytest.raises(FileNotFoundError, match="never downloads"):
        mnist(tmp_path, train=False)


def test_read_idx_other_types_and_bad_files(tmp_path):
    arr = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
    _write_idx(tmp_path / "f.idx", arr, code=0x0D)
    out = read_idx(tmp_path / "f.idx")
    assert out.dtype == np.float32 and np.array_equal(out, arr)
    ints = np.array([-70000, 5, 70000], dtype=np.int32)
    _write_idx(tmp_path / "i.idx", ints, code=0x0C)
    assert read_idx(tmp_path / "i.idx").tolist() == ints.tolist()

    (tmp_path / "junk").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="not an idx file"):
        read_idx(tmp_path / "junk")
    good = (tmp_path / "f.idx").read_bytes()
    (tmp_path / "short").write_bytes(good[:-3])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "short")
    (tmp_path / "code").write_bytes(b"\x00\x00\x42\x01" + struct.pack(">I", 0))
    with pytest.raises(ValueError, match="unknown idx element type 0x42"):
        read_idx(tmp_path / "code")
