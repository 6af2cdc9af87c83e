"""A global batch the ranks do not divide (64 over 3): allreduce mode must still be
one process with the whole batch. A copy of the mode that skips the weighting shows
that the weighting is what makes it so."""

import torch
from _report import all_same, max_diff, params_hash, report
from torch import nn
from torch.nn import functional as F

from clusterkernel import comm
from clusterkernel.data import digits
from clusterkernel.partition import DataPartitioner, distributed_loader, set_epoch
from clusterkernel.train import Trainer, register_mode
from clusterkernel.train._modes import AllReduceMode

SPLIT = DataPartitioner(digits(), [1440, 357], seed=0)  # 22 batches of 64 and one of 32
TRAIN = SPLIT.use(0)
BATCH, EPOCHS = 64, 2


def net(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))


def optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def reference() -> nn.Module:
    """One process, plain loop, the whole global batch per step."""
    model = net(seed=1)
    opt = optimizer(model)
    loader = distributed_loader(TRAIN, BATCH, seed=0, size=1, rank=0)
    for epoch in range(EPOCHS):
        set_epoch(loader, epoch)
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return model


class Unweighted(AllReduceMode):
    """allreduce without the share weighting: a plain mean of unequal batches."""

    name = "allreduce_unweighted"

    def forward_backward(self, module, batch, loss_fn, weight=1.0):
        return super().forward_backward(module, batch, loss_fn, 1.0)


register_mode(Unweighted.name, Unweighted)


def run(mode: str) -> None:
    model = net(seed=1 + comm.rank())  # ranks start apart: the mode syncs them
    trainer = Trainer(model, optimizer(model), F.cross_entropy, TRAIN, mode, batch_size=BATCH)
    sizes = [len(y) for _, y in trainer.train_loader]
    trainer.fit(EPOCHS)
    report(
        scenario=mode,
        batch_sizes=sizes,
        steps=trainer.global_step,
        identical=all_same(params_hash(model)),
        max_diff=max_diff(model, reference()),
    )


for mode in ("allreduce", Unweighted.name):
    run(mode)
