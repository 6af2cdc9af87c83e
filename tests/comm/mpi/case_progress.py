"""A multi-step call (ring, shm) progresses while its rank waits for another call.

A ring or shm call in flight moves only when its ranks step it. Here rank 1 sends
to rank 0 only after it has finished such a call, and rank 0 waits for that
message before it waits for the call: rank 0 must step the call while it waits
for the message, or neither rank moves (a deadlock that ends in the case timeout).
"""

from __future__ import annotations

import pytest
import torch
from _helpers import RANK, SIZE, agree

from clusterkernel import comm

N = 1 << 20  # 4 MB of float32: many steps in either algorithm


@pytest.mark.parametrize("algorithm", ["ring", "shm"])
def test_waiting_on_a_receive_steps_the_call_in_flight(algorithm):
    big = torch.full((N,), float(RANK + 1))
    msg = torch.zeros(3)
    work = comm.all_reduce(big, algorithm=algorithm, async_op=True)
    if RANK == 0 and SIZE > 1:
        comm.irecv(msg, src=1).wait()  # rank 1 sends only after the all_reduce
        work.wait()
    else:
        work.wait()
        if RANK == 1:
            comm.send(torch.full((3,), 7.0), dst=0)
    got = RANK != 0 or SIZE == 1 or bool((msg == 7).all())
    agree(got and bool((big == SIZE * (SIZE + 1) / 2).all()), algorithm)
