"""What the dashboard benchmarks share (``bench_dashboard_*.py``).

- :data:`CONFIGS` and :data:`TRAIN_DEF`: the two Trainer runs a dashboard is measured
  against (``primary``: 2 ranks, the issue 4 model and data; ``stress``: 4 ranks on 2
  cores, a tiny MLP), used by ``bench_dashboard_training.py`` and
  ``bench_dashboard_toggle.py``;
- :func:`tree_cpu`: CPU seconds so far of this process's Chromium and Jupyter server;
- :func:`print_browser_cpu`: the table of Chromium's CPU share per pattern;
- :class:`Quiet`: a renderer that shows nothing.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


class Quiet:
    """A renderer that shows nothing (the benchmark reads results itself)."""

    def update(self, rank, out):
        pass

    def notice(self, text):
        pass

    def finish(self):
        pass


# Two configurations of the same Trainer run (allreduce), each with its own cluster:
# - primary: ranks <= cores, the issue 4 model and data (MLP 784-256-10 on the
#   784-input teacher set of benchmarks/bench_train.py, global batch 128, SGD lr 0.01);
# - stress: 4 busy-polling ranks on 2 cores and a tiny 20-64-4 MLP (global batch 64),
#   so every cycle the notebook, server or browser takes stalls a rank.
CONFIGS = {
    "primary": {
        "ranks": 2,
        "epochs": 150,
        "title": "2 ranks, MLP 784-256-10, global batch 128",
        "data": "teacher(n=2048, in_features=784, classes=10, seed=0)",
        "model": "nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)",
        "batch": 128,
        "lr": 0.01,
    },
    "stress": {
        "ranks": 4,
        "epochs": 60,
        "title": "4 ranks on 2 cores, MLP 20-64-4, global batch 64",
        "data": "teacher(n=2048, in_features=20, classes=4, hidden=16)",
        "model": "nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4)",
        "batch": 64,
        "lr": 0.05,
    },
}

TRAIN_DEF = """%%mpi
import time
import torch
from torch import nn
from clusterkernel.data import teacher
from clusterkernel.train import Trainer
torch.set_num_threads(1)
DATA = {data}

def bench_run(epochs, epoch_ends=None):
    torch.manual_seed(0)
    model = nn.Sequential({model})
    opt = torch.optim.SGD(model.parameters(), lr={lr})
    trainer = Trainer(model, opt, nn.functional.cross_entropy, DATA, batch_size={batch},
                      prefetch=False)
    if epoch_ends is not None:  # wall time of every epoch's end (bench_dashboard_toggle.py)
        trainer.add_hook("on_epoch_end", lambda t: epoch_ends.append(time.time()))
    t0 = time.perf_counter()
    trainer.fit(epochs=epochs)
    return len(DATA) * epochs / (time.perf_counter() - t0)
"""


def tree_cpu() -> dict[str, float]:
    """CPU seconds so far of Chromium's processes and of the Jupyter server (ours only)."""
    import psutil

    out = {"browser": 0.0, "server": 0.0}
    for proc in psutil.Process().children(recursive=True):
        try:
            name, cmd = proc.name(), " ".join(proc.cmdline())
            times = proc.cpu_times()
        except psutil.Error:
            continue
        if "chrom" in name or "headless_shell" in name:
            out["browser"] += times.user + times.system
        elif "jupyter-lab" in cmd:
            out["server"] += times.user + times.system
    return out


def print_browser_cpu(title: str, res: dict[str, list[float]]) -> None:
    """A table of Chromium's CPU share per pattern (``bench_dashboard_draw.py``, ``_page.py``)."""
    print(f"\n{title}")
    print("| pattern | browser CPU (median) | each |")
    print("|---|---|---|")
    for name, values in res.items():
        each = ", ".join(f"{100 * v:.1f}" for v in values)
        print(f"| {name} | {100 * statistics.median(values):.1f} % | {each} |")
