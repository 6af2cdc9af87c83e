"""torch.distributed's collective timings as the dashboard's ``comm`` records (rank side).

Two of torch's own mechanisms, because neither covers every case alone:

- **the flight recorder** (:func:`collect`, run by the metrics stream at each send):
  every collective of every group, whoever called it (DDP's reducer, FSDP2, your
  cell), with the duration torch measured. torch measures durations on NCCL
  (``TORCH_NCCL_ENABLE_TIMING=1``, which ``--torch`` sets on GPU ranks); gloo's
  entries in torch 2.13 carry no duration, and those are not turned into records
  (a made-up time would be worse than none);
- **a DDP communication hook** (:func:`timed_allreduce_hook`): torch's default
  all-reduce of each gradient bucket, timed from issue to completion on any
  backend. clusterkernel registers it on every DDP model made on a rank that
  records metrics (:mod:`._ddp`); calling it yourself is no longer needed.

Records land in the rank's recorder (``clusterkernel.metrics``) with
``algorithm`` set to the backend, next to ``comm``'s own.

Example (a ``%%mpi`` cell, gloo)::

    from clusterkernel.torchdist import timed_allreduce_hook
    ddp = DistributedDataParallel(net)
    ddp.register_comm_hook(None, timed_allreduce_hook)
"""

from __future__ import annotations

import sys
import time

from clusterkernel.torchdist._flight import _DTYPES, dump
from clusterkernel.torchdist._group import backend_name

_NAN = float("nan")
_seen: dict[int, int] = {}  # id of the recorder -> last record_id turned into a record


def collect(recorder) -> int:
    """Append a record for each new completed collective torch timed; return how many.

    Cheap when there is nothing to do: no torch.distributed, no group, or no new
    entry. Only entries with a duration count (see the module docstring).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 0
    data = dump()
    entries = data.get("entries") or []
    last = _seen.get(id(recorder), -1)
    fresh = [e for e in entries if e["record_id"] > last]
    if not fresh:
        return 0
    # torch stamps entries with time.time_ns(); the recorder's clock is perf_counter
    offset = time.perf_counter() - time.time()
    backend = backend_name(dist)
    size = dist.get_world_size()
    added = 0
    for e in fresh:
        ms = e.get("duration_ms")
        if ms is None:
            if e.get("state") != "completed" and not e.get("retired"):
                break  # not finished yet: look again next time, keep the order
            _seen[id(recorder)] = e["record_id"]
            continue
        nbytes = _nbytes(e)
        start = e["time_created_ns"] / 1e9 + offset
        op = str(e.get("profiling_name", "")).split(":", 1)[-1]
        recorder.timing(f"torch {op}", nbytes, start, float(ms) / 1e3, 0.0, backend, size)
        _seen[id(recorder)] = e["record_id"]
        added += 1
    return added


def _nbytes(e: dict) -> int:
    total = 0
    for shape, dt in zip(e.get("input_sizes") or [], e.get("input_dtypes") or []):
        count = 1
        for d in shape:
            count *= int(d)
        total += count * _DTYPES.get(dt, ("", 0))[1]
    return total


def timed_allreduce_hook(state, bucket):
    """torch DDP's default all-reduce hook, timed into the metrics recorder.

    Same result as DDP without a hook (sum, then divide by the world size); the
    bucket's issue-to-completion time goes to the dashboard as ``torch all_reduce``.
    ``state`` is the process group (None: the default), as for torch's hooks.
    """
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from clusterkernel import metrics

    rec = metrics.recorder()
    group = state if state is not None else dist.group.WORLD
    buf = bucket.buffer()
    start = time.perf_counter()
    fut = allreduce_hook(state, bucket)
    backend = str(dist.get_backend(group))
    if backend not in ("gloo", "nccl"):
        backend = backend_name(dist)
    size = dist.get_world_size(group)

    def done(f):  # blocked time: not measured (NaN), the call overlaps the backward pass
        rec.timing(
            "torch all_reduce", buf.nbytes, start, time.perf_counter() - start, _NAN, backend, size
        )
        return f.value()

    return fut.then(done)
