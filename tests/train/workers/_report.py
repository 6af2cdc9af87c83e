"""What worker scripts share: report a result line, build small deterministic models."""

import hashlib

import torch
from torch import nn

from clusterkernel import comm
from tests._results import params_hash, report  # noqa: F401  (the workers import them here)

torch.set_num_threads(1)


def digest(data: bytes) -> str:
    """A hash that is the same in every process (unlike salted ``hash()``)."""
    return hashlib.sha256(data).hexdigest()


def all_same(value) -> bool:
    out = [None] * comm.size()
    comm.all_gather_object(out, value)
    return len(set(out)) == 1


def mlp(seed: int, widths=(10, 32, 32, 3)) -> nn.Sequential:
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))
