"""Run by each of 4 ranks, 2 per host (test_multi_host.py): algorithm="hier" across hosts.

Checks several ops and dtypes against numpy on the whole world (2 + 2 ranks), on
ranks 0, 1, 2 (2 + 1: uneven) and on ranks 0, 2 (one per host); then counts the
bytes one large hier call, and one flat MPI call, moved over the link (rank 0
reads this host's end of it: ``HIER_LINK_STATS``). Rank 0 prints one line
``RESULT <json>``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "comm" / "mpi"))

import torch  # noqa: E402
from _helpers import as_ref, close, data, reduce_ref  # noqa: E402
from mpi4py import MPI  # noqa: E402

from clusterkernel import comm  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK = WORLD.Get_rank()
CASES = [
    (comm.SUM, torch.float32),
    (comm.AVG, torch.bfloat16),
    (comm.MAX, torch.int64),
    (comm.PRODUCT, torch.float64),
    (comm.MIN, torch.uint32),
    (comm.SUM, torch.bool),
    (comm.AVG, torch.complex64),
]
SIZES = (3, 100_001, 1 << 18)
BIG = 16 << 20  # bytes of the counted call


def check(group: comm.Group) -> list:
    bad = []
    for op, dtype in CASES:
        for n in SIZES:
            t = data(n % 31, RANK, (n,), dtype, op)
            works = comm.all_reduce(t, op=op, group=group, algorithm="hier", async_op=n == 3)
            if works is not None:
                works.wait()
            arrays = [as_ref(data(n % 31, r, (n,), dtype, op)) for r in group.ranks]
            if not close(t, reduce_ref(op, arrays, dtype), dtype):
                bad.append((op.name, str(dtype), n))
    return bad


def link_bytes() -> int:
    stats = Path(os.environ["HIER_LINK_STATS"])
    return sum(int((stats / f).read_text()) for f in ("rx_bytes", "tx_bytes"))


def crossed(algorithm: str) -> int:
    t = torch.ones(BIG // 4)
    comm.all_reduce(t, algorithm=algorithm)  # set-up, segment growth, signature check
    WORLD.Barrier()
    before = link_bytes() if RANK == 0 else 0
    WORLD.Barrier()
    comm.all_reduce(t, algorithm=algorithm)
    WORLD.Barrier()
    return link_bytes() - before if RANK == 0 else 0


def main() -> None:
    node = comm.node_group()
    where = WORLD.gather((socket.gethostname(), list(node.ranks)))
    bad = {"world": check(comm.WORLD)}
    uneven = comm.new_group([0, 1, 2])
    apart = comm.new_group([0, 2])
    if RANK in uneven.ranks:
        bad["0,1,2"] = check(uneven)
    if RANK in apart.ranks:
        bad["0,2"] = check(apart)
    layout = (comm.WORLD._hier.nodes, comm.WORLD._hier.even)
    comm.destroy_group(uneven)
    comm.destroy_group(apart)
    hier, flat = crossed("hier"), crossed("mpi")
    # algorithm="auto" (the default) on a group spanning hosts: the shipped table's
    # several-node rule picks hier in the middle sizes, and never shared memory.
    picks = {n: comm.auto_choice("all_reduce", n) for n in (4096, 1 << 20, 64 << 20)}
    t = torch.full((1 << 18,), float(RANK + 1))
    comm.all_reduce(t)
    auto_ok = bool((t == 10.0).all())
    bads = WORLD.gather(bad)
    if RANK == 0:
        result = {
            "where": where,
            "bad": bads,
            "layout": layout,
            "bytes": BIG,
            "hier": hier,
            "flat": flat,
            "auto": {"picks": picks, "sum_ok": auto_ok},
        }
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
