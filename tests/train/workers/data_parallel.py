"""DataParallel on real ranks: equivalence with one process, bit-identical replicas,
gradient accumulation, unused parameters, buffers, fp16, misuse errors."""

import torch
from _report import all_same, digest, max_diff, mlp, params_hash, report
from torch import nn
from torch.nn import functional as F

from clusterkernel import comm
from clusterkernel.data import teacher
from clusterkernel.partition import distributed_loader, set_epoch
from clusterkernel.train import DataParallel

RANK, WORLD = comm.rank(), comm.size()
GLOBAL_BATCH = 12
DATA = teacher(n=72, in_features=10, classes=3, seed=1)


def batches(size, rank, epoch=0):
    loader = distributed_loader(DATA, GLOBAL_BATCH, seed=4, size=size, rank=rank)
    set_epoch(loader, epoch)
    return list(loader)


def sgd_step(model, opt, x, y, set_to_none: bool = True) -> None:
    opt.zero_grad(set_to_none=set_to_none)
    F.cross_entropy(model(x), y).backward()
    opt.step()


def beside_one_process(model, opt, ref, ref_opt, set_to_none: bool = True) -> list[bool]:
    """Train ``model`` on this rank's shards and ``ref`` on the whole batches, step by
    step; return, per step, whether all ranks hold identical parameters."""
    identical = []
    for (x, y), (gx, gy) in zip(batches(WORLD, RANK), batches(1, 0)):
        sgd_step(model, opt, x, y, set_to_none)
        sgd_step(ref, ref_opt, gx, gy)
        identical.append(all_same(params_hash(model)))
    return identical


def equivalence(set_to_none: bool) -> None:
    net = mlp(seed=100 + RANK)  # ranks start different: DataParallel must fix that
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    model = DataParallel(net, optimizer=opt, bucket_bytes=1500)
    ref = mlp(seed=100)  # rank 0's initial model, trained in one process below
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    identical = beside_one_process(model, opt, ref, ref_opt, set_to_none=set_to_none)
    report(
        scenario=f"equivalence_set_to_none={set_to_none}",
        steps=len(identical),
        identical=identical,
        max_diff=max_diff(net, ref),
        buckets=len(model.buckets),
        comm_seconds=model.total_comm_seconds,
    )
    model.remove_hooks()


def accumulation() -> None:
    net = mlp(seed=7)
    opt = torch.optim.SGD(net.parameters(), lr=0.2)
    model = DataParallel(net, optimizer=opt, bucket_bytes=1500)
    ref = mlp(seed=7)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    for (x, y), (gx, gy) in zip(batches(WORLD, RANK, epoch=1), batches(1, 0, epoch=1)):
        opt.zero_grad()
        half = len(x) // 2
        with model.no_sync():
            (F.cross_entropy(model(x[:half]), y[:half]) / 2).backward()
        (F.cross_entropy(model(x[half:]), y[half:]) / 2).backward()
        opt.step()
        sgd_step(ref, ref_opt, gx, gy)
    report(scenario="no_sync", max_diff=max_diff(net, ref), identical=all_same(params_hash(net)))
    model.remove_hooks()


class Heads(nn.Module):
    """A trunk and three heads: which heads a rank uses depends on the rank."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.trunk = nn.Linear(10, 8)
        self.a = nn.Linear(8, 3)  # used on even ranks
        self.b = nn.Linear(8, 3)  # used on rank 1 only
        self.c = nn.Linear(8, 3)  # used nowhere

    def forward(self, x, rank):
        h = torch.tanh(self.trunk(x))
        out = torch.zeros(len(x), 3)
        if rank % 2 == 0:
            out = out + self.a(h)
        if rank == 1:
            out = out + self.b(h)
        return out


def unused() -> None:
    def local_grads(rank):
        m = Heads()
        x, y = batches(WORLD, rank)[0]
        F.cross_entropy(m(x, rank), y).backward()
        return {n: p.grad for n, p in m.named_parameters()}

    # the expected average: every rank's local gradient (zeros where unused), over WORLD
    per_rank = [local_grads(r) for r in range(WORLD)]
    expected = {}
    for name, _ in Heads().named_parameters():
        gs = [g[name] for g in per_rank if g[name] is not None]
        expected[name] = None if not gs else sum(gs) / WORLD

    net = Heads()
    model = DataParallel(net, bucket_bytes=200)  # several buckets, some partly used
    x, y = batches(WORLD, RANK)[0]
    for _ in range(2):  # twice: the second step starts from bucket-view grads
        for p in net.parameters():
            p.grad = None
        F.cross_entropy(model(x, RANK), y).backward()
        model.synchronize()
    none_ok, diff = True, 0.0
    for name, p in net.named_parameters():
        if expected[name] is None:
            none_ok &= p.grad is None
        else:
            none_ok &= p.grad is not None
            if p.grad is not None:
                diff = max(diff, (p.grad - expected[name]).abs().max().item())
    grads = b"".join(p.grad.numpy().tobytes() for p in net.parameters() if p.grad is not None)
    report(scenario="unused", none_ok=none_ok, max_diff=diff, identical=all_same(digest(grads)))
    model.remove_hooks()


def bn_model():
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def buffers(mode: str) -> None:
    def local_stats(rank):
        m = bn_model()
        x, y = batches(WORLD, rank)[0]
        F.cross_entropy(m(x), y).backward()
        return m[1].running_mean.clone(), m[1].running_var.clone()

    stats = [local_stats(r) for r in range(WORLD)]
    if mode == "average":
        exp_mean = sum(s[0] for s in stats) / WORLD
        exp_var = sum(s[1] for s in stats) / WORLD
    else:
        exp_mean, exp_var = stats[0]
    net = bn_model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    model = DataParallel(net, optimizer=opt, buffers=mode)
    x, y = batches(WORLD, RANK)[0]
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    bn = net[1]
    diff = max(
        (bn.running_mean - exp_mean).abs().max().item(),
        (bn.running_var - exp_var).abs().max().item(),
    )
    bufs = b"".join(b.numpy().tobytes() for b in net.buffers())
    report(
        scenario=f"buffers_{mode}",
        max_diff=diff,
        identical=all_same(digest(bufs)),
        tracked=int(bn.num_batches_tracked),
    )
    model.remove_hooks()


def fp16() -> None:
    net = mlp(seed=9)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    model = DataParallel(net, optimizer=opt, compression="fp16", bucket_bytes=1500)
    ref = mlp(seed=9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    identical = beside_one_process(model, opt, ref, ref_opt)
    report(scenario="fp16", max_diff=max_diff(net, ref), identical=all(identical))
    model.remove_hooks()


def misuse() -> None:
    net = mlp(seed=11)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    model = DataParallel(net)  # no optimizer: synchronize() is the caller's job
    x, y = batches(WORLD, RANK)[0]
    F.cross_entropy(model(x), y).backward()
    opt.step()  # forgot model.synchronize()
    errors = {}
    try:
        model(x)
    except RuntimeError as exc:
        errors["forgot"] = str(exc)
    model.synchronize()
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward(retain_graph=True)
    try:
        loss.backward()  # a second backward in one step without no_sync
    except RuntimeError as exc:
        errors["twice"] = str(exc)
    model.synchronize()
    # after the errors the wrapper is usable again: a proper step averages as usual
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    model.synchronize()
    grads = b"".join(p.grad.numpy().tobytes() for p in net.parameters())
    report(scenario="misuse", errors=errors, still_works=all_same(digest(grads)))
    model.remove_hooks()


equivalence(set_to_none=True)
equivalence(set_to_none=False)
accumulation()
unused()
buffers("average")
buffers("broadcast")
fp16()
misuse()
