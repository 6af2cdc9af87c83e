"""What ``torchdist.Keeper.save`` costs beside a training step of the model it keeps.

Run: python benchmarks/bench_keep.py [--ranks 2 4] [--mib 100] [--rounds 5]

An FSDP2 model of ``--mib`` MiB of float32 ``Linear`` layers (4 of them, each
``fully_shard``-ed, then the whole), Adam, on ``--ranks`` gloo processes on this
machine (``torch.multiprocessing``: the save's cost is torch's gather and one send,
not clusterkernel's ranks). Per round, each timed between barriers: one training step
(batch of 16), one ``keep.save`` split into its gather (torch's
``get_model_state_dict``/``get_optimizer_state_dict``, full state, CPU, to rank 0) and
its send (rank 0's copy to rank 1, ``send_object_list``). Medians over rounds; the
bytes a holder keeps. Takes the MPI lock (``/tmp/ck-ranks.lock``) with ``flock``
around it: it loads every core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _rank(rank: int, size: int, dim: int, rounds: int, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from clusterkernel.torchdist import _keep

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    torch.set_num_threads(1)

    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(dim, dim) for _ in range(4)])
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    keep = _keep.Keeper(build)
    model, opt = keep.model, keep.optimizer
    x = torch.randn(16, dim)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    def timed(fn) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - t0

    step()
    steps, saves, gathers = [], [], []
    for i in range(rounds):
        steps.append(timed(step))
        saves.append(timed(lambda i=i: keep.save(i)))
        gathers.append(timed(lambda: _keep._full_state(model, opt)))
    if rank == 0:
        _, msd, osd = keep._kept
        kept = sum(t.nbytes for t in msd.values()) + sum(
            v.nbytes for s in osd["state"].values() for v in s.values() if torch.is_tensor(v)
        )
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        step_s, save_s, gather_s = map(statistics.median, (steps, saves, gathers))
        print(
            f"{size} ranks | params {params / 2**20:.0f} MiB | kept {kept / 2**20:.0f} MiB "
            f"a holder | step {step_s * 1e3:.0f} ms | save {save_s * 1e3:.0f} ms "
            f"(gather {gather_s * 1e3:.0f}, send {(save_s - gather_s) * 1e3:.0f}) | "
            f"save/step {save_s / step_s:.1f}x",
            flush=True,
        )
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--mib", type=float, default=100.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    dim = int((args.mib * 2**20 / 4 / 4) ** 0.5)  # 4 square layers of float32
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for i, n in enumerate(args.ranks):
        mp.spawn(_rank, args=(n, dim, args.rounds, 29600 + i), nprocs=n)


if __name__ == "__main__":
    main()
