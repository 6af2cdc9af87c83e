"""One step for every call: sync and async leave the same flight entry and timing record.

Every call kind runs from its plan (or, for object calls, through ``begin``) and closes
in the ledger (``_ledger.close``). Each kind here is called sync and then async
(``async_op=True``, waited) with the same arguments, after a first call that agrees its
signature; the two calls must leave one flight entry and one timing record each, equal
but for what must differ (the sequence number, the times, the wait), both naming the
line that made the call. In modes ``"new"`` and ``"every"`` alike.
"""

from __future__ import annotations

import sys

import pytest
import torch
from _helpers import RANK, SIZE, agree

from clusterkernel import comm, metrics
from clusterkernel.comm._flight import FLIGHT

ROOT = SIZE - 1
PEER = RANK ^ 1  # pairs 0-1, 2-3; a rank without a partner sits p2p out
PAIRED = PEER < SIZE


def _outs(n: int = 3, dtype=torch.float32):
    return [torch.empty(n, dtype=dtype) for _ in range(SIZE)]


# Each kind: a function of async_op making one call (every rank makes it; p2p: paired
# ranks). The line that makes the call is the one holding "comm." in the lambda.
KINDS = {
    "all_reduce": lambda a: comm.all_reduce(torch.ones(5), async_op=a),
    "all_reduce AVG": lambda a: comm.all_reduce(torch.ones(5), op=comm.AVG, async_op=a),
    "all_reduce half": lambda a: comm.all_reduce(torch.ones(5, dtype=torch.float16), async_op=a),
    "all_reduce ring": lambda a: comm.all_reduce(torch.ones(64), algorithm="ring", async_op=a),
    "all_reduce strided": lambda a: comm.all_reduce(torch.ones(4, 4).t(), async_op=a),
    "reduce": lambda a: comm.reduce(torch.ones(6), dst=ROOT, op=comm.MAX, async_op=a),
    "reduce_scatter": lambda a: comm.reduce_scatter(
        torch.empty(3), [torch.ones(3)] * SIZE, async_op=a
    ),
    "reduce_scatter_tensor": lambda a: comm.reduce_scatter_tensor(
        torch.empty(2), torch.ones(2 * SIZE), op=comm.AVG, async_op=a
    ),
    "broadcast": lambda a: comm.broadcast(torch.ones(7, dtype=torch.int16), src=ROOT, async_op=a),
    "scatter": lambda a: comm.scatter(
        torch.empty(3), [torch.ones(3)] * SIZE if RANK == ROOT else None, src=ROOT, async_op=a
    ),
    "gather": lambda a: comm.gather(
        torch.ones(3), _outs() if RANK == 0 else None, dst=0, async_op=a
    ),
    "all_gather": lambda a: comm.all_gather(_outs(), torch.ones(3), async_op=a),
    "all_gather_into_tensor": lambda a: comm.all_gather_into_tensor(
        torch.empty(SIZE * 2), torch.ones(2), async_op=a
    ),
    "all_to_all": lambda a: comm.all_to_all(_outs(2), [torch.ones(2)] * SIZE, async_op=a),
    "all_to_all_single": lambda a: comm.all_to_all_single(
        torch.empty(SIZE * 2), torch.ones(SIZE * 2), async_op=a
    ),
    "barrier": lambda a: comm.barrier(async_op=a),
    "broadcast_object": lambda a: comm.broadcast_object({"k": 1}, src=ROOT, async_op=a),
    "all_gather_object": lambda a: comm.all_gather_object([None] * SIZE, RANK, async_op=a),
    "gather_object": lambda a: comm.gather_object(
        RANK, [None] * SIZE if RANK == 0 else None, dst=0, async_op=a
    ),
}

P2P = {
    # the lower rank of a pair sends, the higher receives
    "send/recv": lambda a: (
        comm.send(torch.ones(4), dst=PEER, async_op=a)
        if RANK < PEER
        else comm.recv(torch.empty(4), src=PEER, async_op=a)
    ),
    "recv from any": lambda a: (
        comm.send(torch.ones(2, dtype=torch.float64), dst=PEER, async_op=a)
        if RANK < PEER
        else comm.recv(torch.empty(2, dtype=torch.float64), async_op=a)
    ),
    "send_object": lambda a: (
        comm.send_object([1, 2], dst=PEER, async_op=a)
        if RANK < PEER
        else comm.recv_object(src=PEER, async_op=a)
    ),
}


def _one(fn, async_op: bool):
    """Make one call; its new flight entries and timing records."""
    FLIGHT.clear()
    rec = metrics.recorder()
    rec.drain("comm")
    work = fn(async_op)
    if async_op:
        assert isinstance(work, comm.Work), work
        work.wait()
    return comm.flight(), rec.drain("comm")


def _traces(fn) -> dict:
    fn(False)  # agrees the signature (its first call may set auto's rules up)
    got = {}
    for async_op in (False, True):
        entries, records = _one(fn, async_op)
        got[async_op] = (entries, records)
    return got


def _compare(name: str, got: dict) -> list[str]:
    """What differs between the sync and the async call (empty: nothing)."""
    bad = []
    (es, rs), (ea, ra) = got[False], got[True]
    if len(es) != 1 or len(ea) != 1:
        return [f"{name}: entries sync {es} async {ea}"]
    if len(rs) != 1 or len(ra) != 1:
        return [f"{name}: records sync {rs} async {ra}"]
    drop = ("seq", "line")
    e_s = {k: v for k, v in es[0].items() if k not in drop}
    e_a = {k: v for k, v in ea[0].items() if k not in drop}
    if e_s != e_a or not e_s["done"]:
        bad.append(f"{name}: entry sync {es[0]} async {ea[0]}")
    if es[0]["file"] != __file__:
        bad.append(f"{name}: the entry names {es[0]['file']}:{es[0]['line']}, not this file")
    if es[0]["line"] != ea[0]["line"]:
        bad.append(f"{name}: lines {es[0]['line']} and {ea[0]['line']}")
    if es[0]["peer"] is None and ea[0]["seq"] != es[0]["seq"] + 1:
        bad.append(f"{name}: sequence {es[0]['seq']} then {ea[0]['seq']}")
    keys = ("op", "nbytes", "algorithm", "group_size")
    r_s = {k: rs[0][k] for k in keys}
    r_a = {k: ra[0][k] for k in keys}
    if r_s != r_a or r_s["op"] != e_s["op"] or r_s["nbytes"] != e_s["nbytes"]:
        bad.append(f"{name}: record sync {r_s} async {r_a} (entry {e_s})")
    if rs[0]["wait"] != rs[0]["duration"] or not 0 <= ra[0]["wait"] <= ra[0]["duration"]:
        bad.append(f"{name}: waits sync {rs[0]} async {ra[0]}")
    return bad


@pytest.fixture(params=["new", "every"])
def _mode(request):
    was = comm.check_mode()
    comm.set_check(request.param)
    rec = metrics.recorder()
    enabled = rec.enabled
    rec.enabled = True
    yield
    rec.enabled = enabled
    comm.set_check(was)


@pytest.mark.usefixtures("_mode")
def test_every_collective_kind_leaves_the_same_traces_sync_and_async():
    bad = []
    for name, fn in KINDS.items():
        bad += _compare(name, _traces(fn))
    agree(not bad, "\n".join(bad))


@pytest.mark.usefixtures("_mode")
def test_every_point_to_point_kind_leaves_the_same_traces_sync_and_async():
    bad = []
    if PAIRED:
        for name, fn in P2P.items():
            bad += _compare(name, _traces(fn))
    agree(not bad, "\n".join(bad))


def test_every_tensor_kind_runs_from_a_plan():
    # after the calls above (or now), each kind's plan is in the group's plans
    for fn in KINDS.values():
        fn(False)
    names = {p.name for p in comm.WORLD._plans.values()}
    want = {
        "all_reduce",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "broadcast",
        "scatter",
        "gather",
        "all_gather",
        "all_gather_into_tensor",
        "all_to_all",
        "all_to_all_single",
        "barrier",
    }
    agree(want <= names, f"{sorted(want - names)} have no plan")


def test_the_line_is_the_callers_on_every_path():
    line = sys._getframe().f_lineno + 1
    comm.broadcast(torch.ones(2), src=0)
    entry = comm.flight()[-1]
    agree(entry["line"] == line and entry["file"] == __file__, repr(entry))
