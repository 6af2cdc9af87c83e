"""torch.profiler around a profiled cell (``%%mpi --profile torch``; rank side).

Part of the rank's sampler (``rank/_profile.py`` starts it before the sampler thread
and adds its events to the profile at ``stop``): torch's CPU ops, and the CUDA kernels
on a GPU rank, on the same wall clock as the samples.

Example::

    ops = _TorchOps()
    train_step()
    events, dropped = ops.stop()   # [{"ph": "X", "name": "aten::mm", "ts": ..., ...}], 0
"""

from __future__ import annotations

import os

MAX_TORCH_EVENTS = 200_000
"""torch ops kept per cell (``--profile torch``); the rest are counted in ``torch_dropped``."""


class _TorchOps:
    """torch.profiler (CPU ops; CUDA kernels on a GPU rank) around a cell; its events
    on the wall clock in us (kineto counts ``ts`` from ``baseTimeNanoseconds``)."""

    def __init__(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():  # CUDA kernels too on a GPU rank (not run on CI: no GPU)
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities)
        self._prof.start()

    def stop(self) -> tuple[list[dict], int]:
        import json
        import tempfile

        self._prof.stop()
        fd, path = tempfile.mkstemp(suffix=".json", prefix="ck-torch-")
        os.close(fd)
        try:
            self._prof.export_chrome_trace(path)
            with open(path) as f:
                doc = json.load(f)
        finally:
            os.unlink(path)
        # kineto counts ts (us) from baseTimeNanoseconds: their sum is the wall clock
        base = doc.get("baseTimeNanoseconds", 0) / 1e3
        events = [
            {
                "ph": "X",
                "name": e["name"],
                "cat": e.get("cat", "torch"),
                "ts": e["ts"] + base,
                "dur": e.get("dur", 0.0),
            }
            for e in doc.get("traceEvents", [])
            if e.get("ph") == "X" and "ts" in e and e.get("cat") != "Trace"  # kineto's own span
        ]
        return events[:MAX_TORCH_EVENTS], max(0, len(events) - MAX_TORCH_EVENTS)
