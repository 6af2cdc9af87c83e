"""DataParallel's buckets in shared memory on real ranks: equivalence with one process
with buckets big enough for the zero-copy all_reduce, the memory really shared
between the processes, the algorithms the timing records name, the opt-out, and
the collective fallback when one rank cannot share."""

import os

import torch
from _report import all_same, max_diff, mlp, params_hash, report
from torch import nn
from torch.nn import functional as F

from clusterkernel import comm, metrics
from clusterkernel.comm._auto import ZERO_COPY_MIN
from clusterkernel.comm._groups import resolve
from clusterkernel.comm._shm import alloc as shm_alloc
from clusterkernel.data import teacher
from clusterkernel.partition import distributed_loader, set_epoch
from clusterkernel.train import DataParallel
from clusterkernel.train._shared_buckets import shared_flats

RANK, WORLD = comm.rank(), comm.size()
GLOBAL_BATCH = 12
# Bucket 0 (last layers) and bucket 1 (the first layer) are both >= 1 MB with a wide
# input: two zero-copy calls, the first async and outstanding while the last, blocking,
# runs. With a narrow input the last bucket is small (MPI) while the big ones are
# outstanding in shared memory.
# "small": every bucket below the zero-copy size.
MODELS = {
    "wide_input": (512, 768, 768, 3),
    "narrow_input": (10, 768, 768, 768, 3),
    "small": (10, 32, 32, 3),
}
BUCKET_BYTES = {"small": 1500}


def batches(in_features: int, size: int, rank: int):
    data = teacher(n=72, in_features=in_features, classes=3, seed=1)
    loader = distributed_loader(data, GLOBAL_BATCH, seed=4, size=size, rank=rank)
    set_epoch(loader, 0)
    return list(loader)


def sgd_step(model, opt, x, y, set_to_none: bool) -> None:
    opt.zero_grad(set_to_none=set_to_none)
    F.cross_entropy(model(x), y).backward()
    opt.step()


def seen_by_peers(model: DataParallel) -> bool:
    """Every bucket lies in the group's shm_empty window, and the next rank's bucket,
    read through the window from this process, holds this rank's averaged values
    (after synchronize all ranks hold the same average)."""
    seg = resolve(None)._shm
    ok = seg is not None
    for b in model._reducer.buckets:
        arena, offset = shm_alloc.find(seg, b.flat) if ok else (0, 0)
        if not arena:
            return False
        part = seg.arenas[arena - 1].parts[(RANK + 1) % WORLD]
        theirs = part[offset : offset + b.flat.nbytes].view(b.flat.dtype)
        ok = ok and bool(torch.equal(theirs, b.flat))
    return ok


def equivalence(name: str, shared, set_to_none: bool) -> None:
    widths = MODELS[name]
    net = mlp(seed=100 + RANK, widths=widths)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    bucket_bytes = BUCKET_BYTES.get(name, 1 << 20)
    model = DataParallel(net, optimizer=opt, shared_buckets=shared, bucket_bytes=bucket_bytes)
    ref = mlp(seed=100, widths=widths)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    rec = metrics.recorder()
    rec.clear()
    identical, peers_ok = [], []
    mine, whole = batches(widths[0], WORLD, RANK), batches(widths[0], 1, 0)
    for (x, y), (gx, gy) in zip(mine, whole):
        sgd_step(model, opt, x, y, set_to_none)
        sgd_step(ref, ref_opt, gx, gy, True)
        identical.append(all_same(params_hash(net)))
        if model.shared_buckets:  # all ranks are between steps (all_same synchronized)
            peers_ok.append(seen_by_peers(model))
            comm.barrier()  # ... until every rank has read: the next backward writes
    calls = [
        (r["nbytes"], r["algorithm"])
        for r in rec.records("comm")
        if r["op"] == "all_reduce" and r["group_size"] == WORLD
    ]
    sizes = [b.flat.nbytes for b in model._reducer.buckets]
    report(
        scenario=f"{name} shared={shared} set_to_none={set_to_none}",
        shared=model.shared_buckets,
        steps=len(identical),
        identical=identical,
        max_diff=max_diff(net, ref),
        bucket_bytes=sizes,
        # the bucket all_reduces (the buffer sync is a few bytes and runs MPI)
        algorithms=sorted({c for c in calls if c[0] in sizes}),
        table_pick={s: comm.auto_choice("all_reduce", s) for s in sizes},
        big=ZERO_COPY_MIN,
        peers_ok=peers_ok,
    )
    model.remove_hooks()


def forced() -> None:
    """A group whose auto is forced to MPI: shared buckets would not help."""
    g = comm.new_group(list(range(WORLD)))
    os.environ["CLUSTERKERNEL_ALGORITHM"] = "mpi"
    try:
        comm.auto_choice("all_reduce", 0, g)  # the group's rules are made now, forced
    finally:
        del os.environ["CLUSTERKERNEL_ALGORITHM"]
    model = DataParallel(mlp(seed=3, widths=MODELS["wide_input"]), group=g)
    report(scenario="forced", shared=model.shared_buckets)
    model.remove_hooks()


def mismatch() -> None:
    """Ranks that cut the buckets differently get a clear error, all of them."""
    try:
        DataParallel(mlp(seed=3), bucket_bytes=500 if RANK == 0 else 3000)
        error = ""
    except ValueError as exc:
        error = str(exc)
    comm.barrier()
    report(scenario="mismatch", error=error)


def choice_mismatch() -> None:
    """Ranks passing different shared_buckets get a clear error, all of them (a rank
    passing False used to skip the others' exchange: a hang)."""
    try:
        DataParallel(mlp(seed=3), shared_buckets=False if RANK == 0 else None)
        error = ""
    except ValueError as exc:
        error = str(exc)
    comm.barrier()
    report(scenario="choice mismatch", error=error)


def reuse() -> None:
    """A wrap takes the shared memory of a wrapped model that is gone (on every
    rank), and new memory while that model lives."""

    def wrap(seed: int) -> tuple[DataParallel, int]:
        model = DataParallel(mlp(seed=seed, widths=MODELS["wide_input"]))
        return model, model._reducer.buckets[0].flat.data_ptr()

    first, at_first = wrap(3)
    second, at_second = wrap(4)  # the first still lives
    first.remove_hooks()
    del first
    windows = len(resolve(None)._shm.arenas)
    third, at_third = wrap(5)
    report(
        scenario="reuse",
        shared=[m.shared_buckets for m in (second, third)],
        second_new=at_second != at_first,
        third_reused=at_third == at_first,
        new_windows=len(resolve(None)._shm.arenas) - windows,
    )
    second.remove_hooks()
    third.remove_hooks()


def fallback() -> None:
    """One rank cannot share (a parameter on another device): all ranks fall back
    alike with None, and all raise alike with True."""
    cpu = [nn.Parameter(torch.zeros(4))]
    meta = [nn.Parameter(torch.zeros(4, device="meta"))]
    params = meta if RANK == WORLD - 1 else cpu
    got = shared_flats([(5, torch.float32)], params, None, None)
    try:
        shared_flats([(5, torch.float32)], params, None, True)
        error = ""
    except RuntimeError as exc:
        error = str(exc)
    comm.barrier()  # every rank is still in step after both
    report(scenario="fallback", none_gave=got is None, error=error)


for name in MODELS:
    equivalence(name, None, set_to_none=True)
equivalence("wide_input", None, set_to_none=False)
equivalence("wide_input", False, set_to_none=True)
equivalence("small", None, set_to_none=True)
equivalence("small", True, set_to_none=True)
if WORLD > 1:
    forced()
    mismatch()
    choice_mismatch()
    reuse()
    fallback()
