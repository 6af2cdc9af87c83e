"""Bad input on real ranks: every rank gets a clear error naming the culprit ranks,
nobody hangs. Also checks sync_parameters / average_gradients themselves."""

import torch
from _report import all_same, params_hash, report
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from clusterkernel import comm
from clusterkernel.data import teacher
from clusterkernel.partition import distributed_loader
from clusterkernel.train import (
    DataParallel,
    PipelineParallel,
    ReplicaMismatchError,
    Trainer,
    average_gradients,
    sync_parameters,
)

RANK, WORLD = comm.rank(), comm.size()
LAST = WORLD - 1


def net(hidden=16, extra=False):
    layers = [nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 2)]
    if extra:
        layers.append(nn.Linear(2, 2))
    return nn.Sequential(*layers)


def attempt(fn):
    try:
        fn()
        return "no error"
    except (ReplicaMismatchError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def fit_one_epoch(dataset) -> None:
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    Trainer(model, opt, F.cross_entropy, DataLoader(dataset, batch_size=10)).fit(1)


errors = {}
errors["shape"] = attempt(lambda: DataParallel(net(hidden=17 if RANK == LAST else 16)))
errors["count"] = attempt(lambda: DataParallel(net(extra=RANK == 1)))


def optimizer_differs():
    model = net()
    opt = (torch.optim.Adam if RANK == 1 else torch.optim.SGD)(model.parameters(), lr=0.1)
    DataParallel(model, optimizer=opt)


errors["optimizer"] = attempt(optimizer_differs)


def foreign_optimizer():
    model, other = net(), net()
    DataParallel(model, optimizer=torch.optim.SGD(other.parameters(), lr=0.1))


errors["foreign"] = attempt(foreign_optimizer)


def empty_shard():
    ds = teacher(n=60, in_features=8, classes=2)
    mine = ds if RANK != 1 else TensorDataset(torch.empty(0, 8), torch.empty(0, dtype=torch.long))
    fit_one_epoch(mine)


errors["empty_shard"] = attempt(empty_shard)


def uneven_shards():
    ds = teacher(n=60 if RANK == 0 else 40, in_features=8, classes=2)
    fit_one_epoch(ds)


errors["uneven"] = attempt(uneven_shards)
errors["too_little_data"] = attempt(
    lambda: distributed_loader(teacher(n=WORLD - 1, in_features=8), WORLD, uneven="drop")
)
errors["balance"] = attempt(lambda: PipelineParallel(net(), balance=[3] + [0] * (WORLD - 1)))

# the building blocks themselves, after all that: still in step
torch.manual_seed(RANK)
model = net()
before_same = all_same(params_hash(model))
sync_parameters(model)
after_same = all_same(params_hash(model))
x = torch.randn(4, 8) + RANK
F.cross_entropy(model(x), torch.zeros(4, dtype=torch.long)).backward()
mine = [p.grad.clone() for p in model.parameters()]
average_gradients(model)
summed = [g.clone() for g in mine]
for g in summed:
    comm.all_reduce(g, op=comm.SUM)
avg_ok = all(torch.allclose(p.grad, s / WORLD) for p, s in zip(model.parameters(), summed))
report(errors=errors, before_same=before_same, after_same=after_same, avg_ok=avg_ok)
