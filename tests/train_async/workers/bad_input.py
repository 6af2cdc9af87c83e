"""Bad options and failures inside training, on 3 ranks: each scenario reports,
on every rank, the error it raised (or None). A barrier after each scenario
checks that no rank was left behind in a collective."""

import sys
from pathlib import Path

from _common import BATCH, TRAIN, mlp, report, sgd
from torch.nn import functional as F

from clusterkernel import comm
from clusterkernel.train import ParameterServerMode, Trainer, register_mode

TMP = Path(sys.argv[1])


def trainer(mode="ps", options=None, batch=BATCH, **kw):
    model = mlp(seed=7)
    return Trainer(model, sgd(model), F.cross_entropy, TRAIN, mode=mode, mode_options=options,
                   batch_size=batch, **kw)  # fmt: skip


def attempt(name, fn):
    try:
        fn()
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    report(scenario=name, error=error)
    comm.barrier()


class Boom(Exception):
    pass


def raise_on_rank_1(t):
    if comm.rank() == 1 and t.global_step == 5:
        raise Boom("a bug in rank 1's hook")


def worker_raises():
    t = trainer(hooks={"on_batch_end": raise_on_rank_1})
    t.fit(2)
    assert t.global_step == (0 if t.mode.serves else 60)


class FaultyServerMode(ParameterServerMode):
    """A parameter server whose update raises at its 20th gradient (a server bug)."""

    name = "ps_faulty"

    def _make_handler(self):
        handler = super()._make_handler()
        apply = handler.on_message

        def on_message(w, header, payload):
            if handler.version == 20:
                raise RuntimeError("a bug in the server's update")
            apply(w, header, payload)

        handler.on_message = on_message
        return handler


register_mode(FaultyServerMode.name, FaultyServerMode)


def other_models():
    model = mlp(seed=7) if comm.rank() != 1 else mlp(seed=7)[:1]  # rank 1: first layer only
    Trainer(model, sgd(model), F.cross_entropy, TRAIN, mode="gossip", batch_size=BATCH)


def resume_with_other_servers():
    trainer(checkpoint_dir=TMP).fit(1)
    trainer(options={"servers": 2}, checkpoint_dir=TMP).load_checkpoint()


attempt("no_worker", lambda: trainer(options={"servers": 3}))
attempt("stale_inconsistent", lambda: trainer(options={"staleness": 1, "inconsistent": True}))
attempt("stale_schedule", lambda: trainer(options={"staleness": 1, "push_every": 2}))
attempt("compression", lambda: trainer(options={"compression": "zip"}))
attempt("topk_ratio", lambda: trainer(options={"compression": "topk", "topk_ratio": 2.0}))
attempt("update", lambda: trainer(options={"update": "rmsprop"}))
attempt("gossip_rate", lambda: trainer("gossip", {"rate": 0}))
attempt("easgd_alpha", lambda: trainer("easgd", {"alpha": 1.5}))
attempt("batch", lambda: trainer(batch=1))  # 2 workers: one would get no sample
attempt("worker_raises", worker_raises)
attempt("server_raises", lambda: trainer("ps_faulty").fit(2))
attempt("gossip_raises", lambda: trainer("gossip", hooks={"on_batch_end": raise_on_rank_1}).fit(2))
attempt("other_models", other_models)
attempt("resume_other_servers", resume_with_other_servers)
