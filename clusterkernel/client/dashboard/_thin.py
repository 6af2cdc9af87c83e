"""Thin a long series for plotting without hiding its spikes (min/max per bucket).

The store keeps every point; only what is drawn is thinned, so a plot of 100,000
steps costs the same as one of 1,000 and a loss spike still shows.
"""

from __future__ import annotations

import numpy as np


def thin(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most about ``max_points`` points of ``(x, y)``: each bucket's min and max, in order.

    The first and the last point are always kept.

    Example::

        x, y = thin(np.arange(10_000), loss, 500)   # ~500 points, extremes kept
    """
    n = len(x)
    if max_points < 4:
        raise ValueError(f"max_points must be at least 4, got {max_points}")
    if n <= max_points:
        return x, y
    buckets = max_points // 2
    size = n // buckets
    used = size * buckets
    # NaN (a diverged loss) must neither win nor break argmin/argmax.
    block = y[:used].reshape(buckets, size)
    lo = np.where(np.isnan(block), np.inf, block).argmin(axis=1)
    hi = np.where(np.isnan(block), -np.inf, block).argmax(axis=1)
    base = np.arange(buckets) * size
    # the first and the latest point always: the line must end where the run is now
    idx = np.concatenate([[0], base + lo, base + hi, np.arange(used, n), [n - 1]])
    idx = np.unique(idx)  # sorted, and a bucket whose min is its max counts once
    return x[idx], y[idx]
