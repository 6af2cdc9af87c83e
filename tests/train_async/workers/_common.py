"""What the worker scripts share: the data, the model, reporting, comparing ranks."""

import torch
from torch import nn
from torch.nn import functional as F

from clusterkernel import metrics
from clusterkernel.data import digits
from clusterkernel.partition import DataPartitioner
from tests._results import params_hash, report  # noqa: F401  (the workers import them here)

torch.set_num_threads(1)

SPLIT = DataPartitioner(digits(), [1440, 357], seed=0)
TRAIN, TEST = SPLIT.use(0), SPLIT.use(1)
BATCH = 48  # divisible by 2, 3 and 4 workers
LR, MOMENTUM = 0.1, 0.5


def mlp(seed: int) -> nn.Sequential:
    """The digits MLP 64-32-10."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


@torch.no_grad()
def local_eval(model: nn.Module) -> dict:
    """Loss and accuracy of this rank's model on the whole test set (no communication)."""
    x, y = TEST.data.tensors[0][TEST.indices], TEST.data.tensors[1][TEST.indices]
    out = model(x)
    return {
        "loss": F.cross_entropy(out, y).item(),
        "accuracy": (out.argmax(1) == y).float().mean().item(),
    }


def new_records(kind: str, since: int) -> list[dict]:
    """This rank's metric records of ``kind`` from position ``since`` on."""
    return metrics.recorder().records(kind)[since:]


def mark(kind: str) -> int:
    return len(metrics.recorder().records(kind))
