"""PipelineParallel on real ranks: gradients and loss equal one process's; errors
in any stage reach every rank."""

import torch
from _report import report
from torch import nn
from torch.nn import functional as F

from clusterkernel import comm
from clusterkernel.train import PipelineError, PipelineParallel

RANK, WORLD = comm.rank(), comm.size()


def make(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(),
        nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 3),
    )  # fmt: skip


def stage_of(full: nn.Sequential, balance, rank) -> nn.Sequential:
    start = sum(balance[:rank])
    return nn.Sequential(*list(full)[start : start + balance[rank]])


def grads_match(balance, chunks: int, batch: int) -> None:
    ref = make(seed=10)  # rank 0's model: the pipeline must start from its weights
    pipe = PipelineParallel(make(seed=10 + RANK), balance=balance, chunks=chunks)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    grad_diff, loss_diff = 0.0, 0.0
    for _ in range(3):  # three steps: later steps start from stepped weights
        x = torch.randn(batch, 10, generator=gen)
        y = torch.randint(0, 3, (batch,), generator=gen)
        opt.zero_grad()
        loss = pipe.train_step(x if pipe.first else None, y if pipe.last else None, F.cross_entropy)
        ref_opt.zero_grad()
        ref_loss = F.cross_entropy(ref(x), y)
        ref_loss.backward()
        mine = stage_of(ref, pipe.balance, RANK)
        for p, q in zip(pipe.stage.parameters(), mine.parameters()):
            grad_diff = max(grad_diff, (p.grad - q.grad).abs().max().item())
        loss_diff = max(loss_diff, abs(loss - ref_loss.item()))
        opt.step()
        ref_opt.step()
    out = pipe(x if pipe.first else None)
    fwd_diff = (out - ref(x)).abs().max().item() if pipe.last else 0.0
    report(
        scenario=f"grads_{balance}_{chunks}_{batch}",
        balance=pipe.balance,
        grad_diff=grad_diff,
        loss_diff=loss_diff,
        fwd_diff=fwd_diff,
        none_elsewhere=(out is None) != pipe.last,
    )


def errors() -> None:
    pipe = PipelineParallel(make(seed=3), chunks=2)
    x, y = torch.randn(6, 10), torch.randint(0, 3, (6,))
    got = {}
    cases = {
        "bad_input": (torch.randn(6, 7), y),  # first stage cannot multiply
        "bad_target": (x, y[:4]),  # last stage gets too few targets
        "no_input": (None, y),
    }
    for name, (xi, yi) in cases.items():
        try:
            pipe.train_step(xi if pipe.first else None, yi if pipe.last else None, F.cross_entropy)
            got[name] = "no error"
        except PipelineError as exc:
            got[name] = str(exc)
    # after the errors the pipeline still works
    loss = pipe.train_step(x if pipe.first else None, y if pipe.last else None, F.cross_entropy)
    report(scenario="errors", errors=got, recovered=loss > 0)


if WORLD == 2:
    grads_match([3, 4], chunks=4, batch=16)
    grads_match(None, chunks=3, batch=10)  # uneven micro-batches, automatic balance
else:
    grads_match([2, 2, 3], chunks=4, batch=16)
    grads_match(None, chunks=5, batch=7)
errors()
