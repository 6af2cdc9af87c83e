"""Notebook cells shared by the dashboard tests: a real Trainer run on every rank."""

from __future__ import annotations

import nbformat


def train_cell(epochs: int, magic: str = "%%mpi --dashboard") -> str:
    """A cell training a small classifier with the Trainer (allreduce), plus user logging."""
    return f"""{magic}
import torch
from torch import nn
import clusterkernel
from clusterkernel.data import teacher
from clusterkernel.train import Trainer
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = teacher(n=2048, in_features=20, classes=4, hidden=16)
trainer = Trainer(model, opt, nn.functional.cross_entropy, data, batch_size=64, prefetch=False)
trainer.fit(epochs={epochs})
for i in range(20):
    clusterkernel.log(step=i, accuracy=i / 20)
"""


def notebook(*cells: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb
