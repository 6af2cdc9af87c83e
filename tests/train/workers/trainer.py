"""Trainer on real ranks: fit/evaluate/hooks/metrics, equality with one process,
checkpoint + resume after a crash, pipeline mode, a mode registered from outside."""

import sys
from pathlib import Path

import torch
from _report import all_same, max_diff, params_hash, report
from torch import nn
from torch.nn import functional as F

from clusterkernel import comm, metrics
from clusterkernel.data import digits
from clusterkernel.partition import DataPartitioner, distributed_loader, set_epoch
from clusterkernel.train import Trainer, TrainingMode, average_gradients, register_mode

RANK, WORLD = comm.rank(), comm.size()
TMP = Path(sys.argv[1])
SPLIT = DataPartitioner(digits(), [1440, 357], seed=0)  # 1440 = 30 x 48: no padding
TRAIN, TEST = SPLIT.use(0), SPLIT.use(1)
BATCH = 48  # divisible by 1, 2, 3 and 4 ranks


def net(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))


def reference(epochs: int, seed: int, lr=0.05) -> tuple[nn.Module, list[float]]:
    """One process, plain loop, global batches: what every mode must reproduce."""
    model = net(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loader = distributed_loader(TRAIN, BATCH, seed=0, size=1, rank=0)
    losses = []  # per epoch, weighted by batch size like Trainer.history
    for epoch in range(epochs):
        set_epoch(loader, epoch)
        total, n = 0.0, 0
        for x, y in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            n += len(y)
        losses.append(total / n)
    return model, losses


def fit_and_evaluate() -> None:
    model = net(seed=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    calls = {"on_start": 0, "on_batch_end": 0, "on_epoch_end": 0, "on_end": 0}

    def count(event):
        return lambda t: calls.__setitem__(event, calls[event] + 1)

    rec = metrics.recorder()
    before = len(rec.records("scalar"))
    spans_before = len(rec.records("span"))
    trainer = Trainer(
        model, opt, F.cross_entropy, TRAIN, batch_size=BATCH,
        hooks={e: count(e) for e in calls},
    )  # fmt: skip
    history = trainer.fit(epochs=3)
    ev = trainer.evaluate(TEST)
    ref, _ = reference(3, seed=1)
    logged = [r for r in rec.records("scalar")[before:] if "samples_per_s" in r["values"]]
    spans = [r["name"] for r in rec.records("span")[spans_before:]]
    report(
        scenario="fit",
        calls=calls,
        steps=trainer.global_step,
        epoch_losses=[h["loss"] for h in history],
        eval=ev,
        test_size=len(TEST),
        identical=all_same(params_hash(model)),
        max_diff=max_diff(model, ref),
        logged_steps=[r["step"] for r in logged],
        logged_keys=sorted(logged[0]["values"]) if logged else [],
        logged_rank=logged[0]["rank"] if logged else None,
        positive_throughput=all(r["values"]["samples_per_s"] > 0 for r in logged),
        spans={name: spans.count(name) for name in set(spans)},
    )
    trainer.close()


class Crash(Exception):
    pass


def resume() -> None:
    def make(seed):
        # with dropout: a resumed run matches only if it draws the same masks
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Dropout(0.2), nn.Linear(48, 10))
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    # uninterrupted run
    model, opt = make(2)
    Trainer(model, opt, F.cross_entropy, TRAIN, batch_size=BATCH, prefetch=True).fit(3)
    straight = params_hash(model)

    # the same run, crashing at step 7 after checkpoints every 3 steps
    def crash(t):
        if t.global_step == 7:
            raise Crash()

    ckpt = TMP / "resume"
    model, opt = make(2)
    first = Trainer(
        model, opt, F.cross_entropy, TRAIN, batch_size=BATCH, prefetch=False,
        checkpoint_dir=ckpt, checkpoint_every=3, hooks={"on_batch_end": crash},
    )  # fmt: skip
    crashed = False
    try:
        first.fit(3)
    except Crash:
        crashed = True
    first.close()

    # a fresh process state: other initial weights, fresh optimizer, then resume
    model, opt = make(99)
    second = Trainer(
        model, opt, F.cross_entropy, TRAIN, batch_size=BATCH, checkpoint_dir=ckpt,
        checkpoint_every=3,
    )  # fmt: skip
    loaded = second.load_checkpoint()
    at = (second.epoch, second.step_in_epoch, second.global_step)
    second.fit(3)
    report(
        scenario="resume",
        crashed=crashed,
        loaded=loaded,
        resumed_at=at,
        steps_per_epoch=len(second.train_loader),
        equal=params_hash(model) == straight,
        final_step=second.global_step,
    )
    second.close()


def pipeline() -> None:
    model = net(seed=3 + RANK)  # rank 0's weights win
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer = Trainer(
        model, opt, F.cross_entropy, TRAIN, mode="pipeline", batch_size=BATCH,
        mode_options={"chunks": 3, "balance": [1, 2] if WORLD == 2 else [1, 1, 1]},
        checkpoint_dir=TMP / "pipe",
    )  # fmt: skip
    history = trainer.fit(2)
    ev = trainer.evaluate(TEST)
    ref, ref_losses = reference(2, seed=3)
    stage = list(trainer.module.stage.parameters())
    start = sum(trainer.module.balance[:RANK])
    ref_layers = list(ref)[start : start + len(trainer.module.stage)]
    ref_stage = [p for layer in ref_layers for p in layer.parameters()]
    diff = max(((p - q).abs().max().item() for p, q in zip(stage, ref_stage)), default=0.0)
    # the per-rank checkpoint holds every stage; a fresh trainer gets its own back
    model2 = net(seed=50)
    t2 = Trainer(
        model2, torch.optim.SGD(model2.parameters(), lr=0.05), F.cross_entropy, TRAIN,
        mode="pipeline", batch_size=BATCH, checkpoint_dir=TMP / "pipe",
        mode_options={"chunks": 3, "balance": trainer.module.balance},
    )  # fmt: skip
    t2.load_checkpoint()
    restored = all(torch.equal(p, q) for p, q in zip(t2.module.stage.parameters(), stage))
    report(
        scenario="pipeline",
        max_diff=diff,
        losses=[h["loss"] for h in history],
        ref_losses=ref_losses,
        eval=ev,
        restored=restored,
    )


class TutorialMode(TrainingMode):
    """A mode defined outside the Trainer: the tutorial's average_gradients."""

    name = "tutorial"

    def setup(self, model, optimizer, group=None):
        from clusterkernel.train import sync_parameters

        sync_parameters(model)
        self.steps = 0
        return super().setup(model, optimizer, group)

    def forward_backward(self, module, batch, loss_fn, weight=1.0):
        self.steps += 1
        return super().forward_backward(module, batch, loss_fn, weight)

    def step(self, step):
        average_gradients(self.model)
        super().step(step)


def custom_mode() -> None:
    register_mode("tutorial", TutorialMode)
    model = net(seed=20 + RANK)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer = Trainer(model, opt, F.cross_entropy, TRAIN, mode="tutorial", batch_size=BATCH)
    trainer.fit(1)
    ref, _ = reference(1, seed=20)
    report(
        scenario="custom_mode",
        steps=trainer.mode.steps,
        max_diff=max_diff(model, ref),
        identical=all_same(params_hash(model)),
    )


def group_mode() -> None:
    """allreduce over a sub-group: ranks outside it are not involved at all."""
    group = comm.new_group([0, WORLD - 1])
    if RANK not in group.ranks:
        report(scenario="group", member=False)
        return
    model = net(seed=30 + RANK)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer = Trainer(model, opt, F.cross_entropy, TRAIN, batch_size=BATCH, group=group)
    trainer.fit(1)
    ref, _ = reference(1, seed=30)
    out = [None, None]
    comm.all_gather_object(out, params_hash(model), group=group)
    report(scenario="group", member=True, max_diff=max_diff(model, ref), identical=out[0] == out[1])


fit_and_evaluate()
resume()
custom_mode()
if WORLD >= 2:
    pipeline()
if WORLD >= 3:
    group_mode()
