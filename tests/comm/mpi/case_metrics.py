"""Every comm call leaves one timing record on its rank."""

from __future__ import annotations

import time

import torch
from _helpers import RANK, SIZE, agree

from clusterkernel import comm, metrics
from clusterkernel.protocol.records import COMM_FIELDS


def _new_records(fn):
    rec = metrics.recorder()
    rec.drain("comm")
    fn()
    return rec.drain("comm")


def test_sync_calls_record_op_bytes_algorithm_group():
    def calls():
        comm.all_reduce(torch.ones(1024))
        comm.all_reduce(torch.ones(10, dtype=torch.float64), algorithm="ring")
        comm.broadcast(torch.ones(3, dtype=torch.int16), src=0)
        comm.barrier()

    recs = _new_records(calls)
    got = [(r["op"], r["nbytes"], r["algorithm"], r["group_size"]) for r in recs]
    want = [
        ("all_reduce", 4096, "mpi", SIZE),
        ("all_reduce", 80, "ring", SIZE),
        ("broadcast", 6, "mpi", SIZE),
        ("barrier", 0, "mpi", SIZE),
    ]
    ok = got == want and all(r["kind"] == "comm" and r["rank"] == RANK for r in recs)
    ok = ok and all(set(COMM_FIELDS) <= set(r) for r in recs)
    # Sync calls block throughout: wait equals duration.
    ok = ok and all(r["duration"] >= 0 and r["wait"] == r["duration"] for r in recs)
    agree(ok, str(got))


def test_async_record_separates_wait_from_duration():
    def calls():
        w = comm.all_reduce(torch.ones(256), async_op=True)
        time.sleep(0.02)  # "compute" while the allreduce is in flight
        w.wait()

    (rec,) = _new_records(calls)
    ok = rec["op"] == "all_reduce" and rec["duration"] >= 0.02 and rec["wait"] < rec["duration"]
    agree(ok, str(rec))


def test_an_async_calls_wait_counts_the_time_blocked_in_it():
    """The wait() that the call ends in counts: rank 0 joins 0.2 s late, so every other
    rank blocks in its wait() at least about that long."""

    def calls():
        if RANK == 0:
            time.sleep(0.2)
        comm.all_reduce(torch.ones(256), async_op=True).wait()

    (rec,) = _new_records(calls)
    late = RANK == 0 or SIZE == 1 or rec["wait"] >= 0.1
    agree(late and rec["wait"] <= rec["duration"], str(rec))


def test_group_size_and_p2p_recorded():
    evens = comm.new_group(list(range(0, SIZE, 2)))

    def calls():
        if RANK % 2 == 0:
            comm.all_reduce(torch.ones(2), group=evens)

    recs = _new_records(calls)
    ok = recs == [] if RANK % 2 else [r["group_size"] for r in recs] == [len(evens.ranks)]
    agree(ok, str(recs))


def test_recording_can_be_switched_off():
    metrics.enable(False)
    try:
        recs = _new_records(lambda: comm.all_reduce(torch.ones(4)))
    finally:
        metrics.enable(True)
    again = _new_records(lambda: comm.all_reduce(torch.ones(4)))
    agree(recs == [] and len(again) == 1)
