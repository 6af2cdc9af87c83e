"""The flight recorder and the default mismatch check, on every rank."""

from __future__ import annotations

import warnings

import pytest
import torch
from _helpers import RANK, SIZE, WORLD, agree

from clusterkernel import comm


def _since(n: int) -> list[dict]:
    return comm.flight()[-n:]


def test_each_call_is_noted_with_its_group_sequence_line_and_size():
    first = comm.flight()[-1]["seq"] + 1 if comm.flight() else None
    t = torch.ones(256)
    line = _line_of_next_call()
    comm.all_reduce(t)
    comm.broadcast(torch.ones(3, dtype=torch.int16), src=0)
    comm.barrier()
    got = _since(3)
    ops = [(e["op"], e["nbytes"], e["dtype"], e["group"], e["peer"], e["done"]) for e in got]
    want = [
        ("all_reduce", 1024, "float32", "world", None, True),
        ("broadcast", 6, "int16", "world", None, True),
        ("barrier", 0, "", "world", None, True),
    ]
    seqs = [e["seq"] for e in got]
    ok = ops == want and seqs == list(range(seqs[0], seqs[0] + 3))
    ok = ok and (first is None or seqs[0] == first)
    ok = ok and got[0]["file"] == __file__ and got[0]["line"] == line
    # every rank numbers the world's collectives alike
    everyone: list = [None] * SIZE
    comm.all_gather_object(everyone, seqs)
    agree(ok and all(s == seqs for s in everyone), (ops, seqs, got[0]["line"], line))


def _line_of_next_call() -> int:
    import sys

    return sys._getframe(1).f_lineno + 1


def test_groups_count_on_their_own_and_point_to_point_names_the_peer():
    if SIZE < 2:
        pytest.skip("needs two ranks")
    pair = comm.new_group([0, 1])
    world_before = [e for e in comm.flight() if e["group"] == "world" and e["seq"] >= 0][-1]
    if RANK in (0, 1):
        comm.all_reduce(torch.ones(2), group=pair)
        comm.all_reduce(torch.ones(2), group=pair)
        t = torch.ones(4)
        if RANK == 0:
            comm.send(t, dst=1)
        else:
            comm.recv(t, src=0)
        got = _since(3)
        ok = [e["seq"] for e in got[:2]] == [0, 1] and got[0]["group_ranks"] == [0, 1]
        ok = ok and got[2]["op"] == ("send" if RANK == 0 else "recv")
        ok = ok and got[2]["peer"] == 1 - RANK and got[2]["seq"] == -1
    else:
        ok = True
    comm.barrier()
    world_now = [e for e in comm.flight() if e["group"] == "world" and e["seq"] >= 0][-1]
    agree(ok and world_now["seq"] == world_before["seq"] + 1, comm.flight()[-4:])


def test_async_call_is_pending_until_waited():
    w = comm.all_reduce(torch.ones(64), async_op=True)
    pending = comm.flight()[-1]
    w.wait()
    agree(pending["op"] == "all_reduce" and comm.flight()[-1]["done"], pending)


def test_ring_size_keeps_the_last_calls():
    comm.set_flight(size=4)
    try:
        for _ in range(6):
            comm.barrier()
        agree(len(comm.flight()) == 4 and comm.flight()[-1]["op"] == "barrier")
    finally:
        comm.set_flight(size=64)


def test_mismatched_size_raises_on_every_rank_by_default():
    if SIZE < 2:
        pytest.skip("a mismatch needs two ranks")
    assert comm.check_mode() == "new"  # the default: new signatures are checked
    # A fresh group has agreed on nothing yet: its first call of a signature is checked.
    fresh = comm.new_group()
    t = torch.ones(1000 + 37 if RANK != 1 else 10)
    try:
        comm.all_reduce(t, group=fresh)
        msg = ""
    except comm.CollectiveMismatchError as exc:
        msg = str(exc)
    ok = "rank 1: all_reduce(float32, 10 elements (40 B)" in msg
    ok = ok and "1037 elements (4.05 KiB)" in msg and "ranks [1] differ" in msg
    ok = ok and bool(torch.all(t == 1))  # and no data moved
    comm.destroy_group(fresh)
    agree(ok, msg)


def test_agreed_signatures_are_remembered_and_all_to_all_sizes_may_differ():
    t = torch.ones(77)
    comm.all_reduce(t)
    key = ("all_reduce", torch.float32, 77, comm.SUM, None, "mpi", -1, -1)
    remembered = key in comm.WORLD._sigs
    # all_to_all: each pair agrees on its own size, which may differ between pairs
    ins = [torch.full((RANK + 1,), float(RANK)) for _ in range(SIZE)]
    outs = [torch.empty(r + 1) for r in range(SIZE)]
    comm.all_to_all(outs, ins)
    ok = remembered and all(torch.all(o == r) for r, o in enumerate(outs))
    agree(ok, (remembered, outs))


def test_set_check_modes():
    fresh = comm.new_group()
    key = ("all_reduce", torch.float32, 5, comm.SUM, None, "mpi", -1, -1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)  # the new names do not warn
            comm.set_check("off")
            off = comm.check_mode() == "off" and not comm.check_enabled()
            comm.all_reduce(torch.ones(5), group=fresh)
            off_skipped = key not in fresh._sigs
            comm.set_check("new")
            new = comm.check_mode() == "new" and not comm.check_enabled()
            comm.all_reduce(torch.ones(5), group=fresh)
            new_checked = key in fresh._sigs
            comm.set_check("every")
            every = comm.check_mode() == "every" and comm.check_enabled()
        with pytest.raises(ValueError, match="set_check takes 'new', 'every' or 'off'"):
            comm.set_check("sometimes")
        with pytest.raises(ValueError, match="set_check takes"):
            comm.set_check(1)  # not True: only the old spellings themselves are aliases
    finally:
        comm.set_check("new")
    comm.destroy_group(fresh)
    WORLD.Barrier()
    modes = (off, off_skipped, new, new_checked, every)
    agree(all(modes) and comm.check_mode() == "new", modes)


def test_old_check_spellings_still_work_and_warn():
    seen = {}
    try:
        for old, mode in ((True, "every"), ("all", "every"), (False, "new")):
            with pytest.warns(DeprecationWarning, match=rf"use set_check\('{mode}'\)") as w:
                comm.set_check(old)
            # the warning names the caller's line, not set_check's own
            seen[repr(old)] = (comm.check_mode(), w[0].filename == __file__)
    finally:
        comm.set_check("new")
    want = {"True": ("every", True), "'all'": ("every", True), "False": ("new", True)}
    agree(seen == want, seen)


def test_every_kind_of_call_names_the_users_line():
    here = _line_of_next_call()
    comm.broadcast_object({"x": 1}, src=0)
    comm.all_reduce_coalesced([torch.ones(2), torch.ones(3)])
    comm.all_reduce(torch.ones(2, dtype=torch.float16))  # staged through float32
    comm.all_reduce(torch.ones(8), algorithm="ring")
    comm.all_to_all_single(torch.empty(SIZE), torch.ones(SIZE))
    got = _since(5)
    lines = [e["line"] for e in got]
    files = {e["file"] for e in got}
    agree(lines == list(range(here, here + 5)) and files == {__file__}, (lines, files))
