"""DataParallel's comm hooks on real ranks: the fp16 option is the fp16 hook, a hook of
one's own sees every bucket and can wrap or replace the default, bfloat16 models keep
bfloat16 on the wire, misuse gives clear errors."""

import torch
from _report import all_same, max_diff, mlp, params_hash, report
from torch.nn import functional as F

from clusterkernel import comm
from clusterkernel.data import teacher
from clusterkernel.partition import distributed_loader, set_epoch
from clusterkernel.train import DataParallel, comm_hooks

RANK, WORLD = comm.rank(), comm.size()
GLOBAL_BATCH = 12
DATA = teacher(n=72, in_features=10, classes=3, seed=1)


def batches(size, rank):
    loader = distributed_loader(DATA, GLOBAL_BATCH, seed=4, size=size, rank=rank)
    set_epoch(loader, 0)
    return list(loader)


def reference():
    net = mlp(seed=9)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in batches(1, 0):
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    return net


def trained(register=None, **kw):
    """Train mlp(9) with DataParallel(**kw), after register(model) if given."""
    net = mlp(seed=9)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    model = DataParallel(net, optimizer=opt, bucket_bytes=1500, **kw)
    if register is not None:
        register(model)
    for x, y in batches(WORLD, RANK):
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    model.remove_hooks()
    return net, model


ref = reference()
plain, _ = trained()

# compression="fp16" is exactly fp16_compress_wrapper(allreduce_hook), registered
option, _ = trained(compression="fp16")
wrapped, _ = trained(
    lambda m: m.register_comm_hook(
        None, comm_hooks.fp16_compress_wrapper(comm_hooks.allreduce_hook)
    )
)
report(
    scenario="fp16",
    same_as_option=params_hash(option) == params_hash(wrapped),
    identical=all_same(params_hash(option)),
    max_diff=max_diff(option, ref),
    differs_from_fp32=params_hash(option) != params_hash(plain),
)

# a hook of one's own that watches the buckets and delegates to the default
seen = []


def watch(log, bucket):
    log.append((bucket.index, bucket.buffer().numel(), bucket.is_last(), len(bucket.parameters())))
    return comm_hooks.allreduce_hook(None, bucket)


watched, model = trained(lambda m: m.register_comm_hook(seen, watch))
steps = len(batches(WORLD, RANK))
nbuckets = len(model.buckets)
report(
    scenario="watch",
    same_as_default=params_hash(watched) == params_hash(plain),
    calls=len(seen),
    expected_calls=steps * nbuckets,
    indices=[i for i, *_ in seen[:nbuckets]],
    last=[last for _, _, last, _ in seen[:nbuckets]],
    params=sum(n for *_, n in seen[:nbuckets]),
    model_params=len(list(watched.parameters())),
)


# a hook written from scratch: sum, then divide in a then() callback
def sum_then_divide(state, bucket):
    buf = bucket.buffer()
    work = comm.all_reduce(buf, op=comm.SUM, async_op=True, group=bucket.group)
    return comm_hooks.CommFuture(work, buf).then(lambda fut: fut.value().div_(WORLD))


summed, _ = trained(lambda m: m.register_comm_hook(None, sum_then_divide))
report(
    scenario="sum_hook",
    identical=all_same(params_hash(summed)),
    max_diff_default=max_diff(summed, plain),
)

# bfloat16 models: averaged in float32, bfloat16 on the wire (the half path)
net = mlp(seed=9).to(torch.bfloat16)
model = DataParallel(net, bucket_bytes=700)
x, y = batches(WORLD, RANK)[0]
F.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
model.synchronize()
mine = mlp(seed=9).to(torch.bfloat16)
F.cross_entropy(mine(x.to(torch.bfloat16)).float(), y).backward()
local = torch.cat([p.grad.float().reshape(-1) for p in mine.parameters()])
everyone = [None] * WORLD
comm.all_gather_object(everyone, local)
expected = sum(everyone) / WORLD
got = torch.cat([p.grad.float().reshape(-1) for p in net.parameters()])
report(
    scenario="bfloat16",
    dtype=str(net[0].weight.grad.dtype),
    identical=all_same(got.numpy().tobytes().hex()),
    rel_err=((got - expected).abs().max() / expected.abs().max()).item(),
    buckets=len(model.buckets),
)
model.remove_hooks()

# misuse
errors = {}
net = mlp(seed=9)
model = DataParallel(net, compression="fp16")
for name, call in {
    "after_option": lambda: model.register_comm_hook(None, comm_hooks.allreduce_hook),
    "not_callable": lambda: DataParallel(mlp(seed=9)).register_comm_hook(None, "allreduce"),
}.items():
    try:
        call()
    except (RuntimeError, TypeError) as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"
model.remove_hooks()
model = DataParallel(mlp(seed=9))
model.register_comm_hook(None, comm_hooks.allreduce_hook)
try:
    model.register_comm_hook(None, comm_hooks.allreduce_hook)
except RuntimeError as exc:
    errors["twice"] = str(exc)
model.remove_hooks()
model = DataParallel(mlp(seed=9))
model.register_comm_hook(None, lambda state, b: comm_hooks.CommFuture.completed(b.buffer()[:3]))
F.cross_entropy(model(x), y).backward()
try:
    model.synchronize()
except RuntimeError as exc:
    errors["wrong_value"] = str(exc)
model.remove_hooks()
report(scenario="misuse", errors=errors)
