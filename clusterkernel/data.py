"""Example data sets that need no download, and an MNIST reader for local files.

- :func:`digits` the real 8x8 handwritten digits that ship with scikit-learn
  (1,797 images, 10 classes);
- :func:`teacher` a synthetic classification set labelled by a fixed random
  "teacher" network, of any size and input width;
- :func:`mnist` MNIST (or Fashion-MNIST) from a directory holding the standard
  idx files, read with :func:`read_idx`.

Every loader returns a :class:`torch.utils.data.TensorDataset` of ``(x, y)``.

Example::

    from clusterkernel.data import digits
    ds = digits()          # x: float32 (1797, 64) in [0, 1], y: int64
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

__all__ = ["digits", "mnist", "read_idx", "teacher"]


def digits(flatten: bool = True) -> TensorDataset:
    """scikit-learn's handwritten digits, scaled to ``[0, 1]``.

    ``flatten=False`` gives images of shape ``(1, 8, 8)``.

    Example::

        x, y = digits()[0]      # x.shape == (64,)
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.from_numpy(bunch.data.astype(np.float32) / 16.0)
    if not flatten:
        x = x.reshape(-1, 1, 8, 8)
    return TensorDataset(x, torch.from_numpy(bunch.target.astype(np.int64)))


def teacher(
    n: int = 4096,
    in_features: int = 784,
    classes: int = 10,
    hidden: int = 64,
    seed: int = 0,
) -> TensorDataset:
    """A classification set whose labels come from a fixed random network.

    Inputs are standard normal; labels are the argmax of a random two-layer tanh
    network, so a student network can learn them. The same arguments give the same
    data on every rank and every run.

    Example::

        ds = teacher(n=2048, in_features=784)   # MNIST-shaped inputs
    """
    if n < 1 or in_features < 1 or classes < 2 or hidden < 1:
        raise ValueError("teacher() needs n >= 1, in_features >= 1, hidden >= 1, classes >= 2.")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_features, generator=gen)
    w1 = torch.randn(in_features, hidden, generator=gen) / in_features**0.5
    w2 = torch.randn(hidden, classes, generator=gen) / hidden**0.5
    y = torch.tanh(x @ w1).matmul(w2).argmax(dim=1)
    return TensorDataset(x, y)


# idx element type code -> numpy dtype (big-endian, as the format stores them)
_IDX_TYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one idx file (optionally ``.gz``) into a numpy array.

    The header is two zero bytes, a type code, the number of dimensions, then
    one big-endian uint32 per dimension; MNIST images have magic 2051 (ubyte, 3
    dims) and labels 2049 (ubyte, 1 dim).

    Example::

        # not run: it needs MNIST's files, which nothing here downloads
        images = read_idx("data/train-images-idx3-ubyte")   # (60000, 28, 28) uint8
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path} is not an idx file (it does not start with two zero bytes).")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_TYPES:
        raise ValueError(f"{path}: unknown idx element type 0x{code:02x}.")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: file ends inside the header.")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_TYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(
            f"{path}: header says shape {shape} ({expected} bytes of data) but the file "
            f"holds {len(raw) - header}; the file is truncated or not idx."
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def _find(root: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx")):
        if (root / name).is_file():
            return root / name
    raise FileNotFoundError(
        f"no {stem} (or {stem}.gz) in {root}. Put the MNIST idx files there; this "
        "loader never downloads."
    )


def mnist(root: str | os.PathLike, train: bool = True, flatten: bool = False) -> TensorDataset:
    """MNIST from ``root`` holding the standard idx files; never downloads.

    Reads ``train-images-idx3-ubyte`` / ``train-labels-idx1-ubyte`` (or the
    ``t10k-`` pair for ``train=False``), plain or ``.gz``. Images become float32
    in ``[0, 1]`` of shape ``(N, 1, 28, 28)``, or ``(N, 784)`` with ``flatten``.

    Example::

        # not run: it needs MNIST's files, which nothing here downloads
        ds = mnist("~/data/mnist", train=True, flatten=True)
    """
    root = Path(root).expanduser()
    prefix = "train" if train else "t10k"
    images = read_idx(_find(root, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(_find(root, f"{prefix}-labels-idx1-ubyte"))
    if images.ndim != 3 or labels.ndim != 1:
        raise ValueError(
            f"expected images of 3 dims and labels of 1 in {root}, got {images.shape} "
            f"and {labels.shape}."
        )
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels in {root}.")
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    if flatten:
        x = x.reshape(len(x), -1)
    return TensorDataset(x, torch.from_numpy(labels.astype(np.int64)))
