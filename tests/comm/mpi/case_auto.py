"""algorithm="auto" on every rank: rules from a table file, the forced algorithm,
errors raised on every rank, the choice in the timing record, and comm.tune()."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import pytest
import torch
from _helpers import RANK, SIZE, WORLD, agree, expect_error

from clusterkernel import comm, metrics
from clusterkernel.comm import _auto

KB = 1024


@pytest.fixture
def table_file(tmp_path_factory):
    """A table file (same path on every rank) and the env pointing at it, undone after."""
    path = Path(WORLD.bcast(str(tmp_path_factory.mktemp("auto")) if RANK == 0 else None))

    def write(rules: list[dict]) -> None:
        if RANK == 0:
            path.joinpath("t.json").write_text(json.dumps({"version": 1, "rules": rules}))
        WORLD.Barrier()
        os.environ[_auto.ENV_TABLE] = str(path / "t.json")

    yield write
    os.environ.pop(_auto.ENV_TABLE, None)
    os.environ.pop(_auto.ENV_ALGORITHM, None)
    os.environ.pop(_auto.adapt.ENV_ADAPT, None)


def _row(op, limits, algs, nodes=1, ranks=SIZE):
    return {"op": op, "nodes": nodes, "ranks": ranks, "limits": limits, "algs": algs}


def _fresh():
    """A new group of every rank: its first auto call reads the table anew."""
    return comm.new_group(list(range(SIZE)))


def test_rules_from_a_table_pick_by_size_and_are_recorded(table_file):
    table_file([_row("all_reduce", [16 * KB, 1 << 20], ["mpi", "shm", "ring"])])
    g = _fresh()
    picks = [comm.auto_choice("all_reduce", n, g) for n in (4 * KB, 64 * KB, 4 << 20)]
    agree(picks == ["mpi", "shm", "ring"], f"picks {picks}")
    rec = metrics.recorder()
    ok = True
    for n in (1024, 16 * 1024, 1 << 20):  # float32: 4 KB, 64 KB, 4 MB
        t = torch.full((n,), float(RANK + 1))
        comm.all_reduce(t, group=g)
        ok = ok and bool((t == SIZE * (SIZE + 1) / 2).all())
    algs = [r["algorithm"] for r in rec.records("comm") if r["op"] == "all_reduce"][-3:]
    agree(ok, "sums")
    agree(algs == ["mpi", "shm", "ring"], f"recorded {algs}")
    comm.destroy_group(g)


def test_the_nearest_group_size_and_a_missing_op_fall_back(table_file):
    # Only a rule for 64 ranks (the nearest there is) and none for broadcast.
    table_file([_row("all_reduce", [100], ["mpi", "shm"], ranks=64)])
    g = _fresh()
    agree(comm.auto_choice("all_reduce", 4 * KB, g) == "shm", "nearest size")
    agree(comm.auto_choice("broadcast", 1 << 26, g) == "mpi", "no rule: mpi")
    comm.destroy_group(g)


def test_rules_for_several_nodes_never_use_shared_memory():
    rules = _auto.rules_for([_row("all_reduce", [100], ["mpi", "shm"], nodes=2)], 2, 4)
    assert rules["all_reduce"] == ((100,), ("mpi", "mpi"))
    one_node = _auto.rules_for([_row("all_reduce", [100], ["mpi", "shm"], nodes=2)], 1, 4)
    assert one_node["all_reduce"] == ((), ("mpi",))  # a several-node row is not used


def test_forced_algorithm_applies_where_the_op_has_it(table_file):
    table_file([_row("broadcast", [], ["shm"])])
    os.environ[_auto.ENV_ALGORITHM] = "ring"
    g = _fresh()
    agree(comm.auto_choice("all_reduce", 4 * KB, g) == "ring", "forced ring")
    agree(comm.auto_choice("broadcast", 4 * KB, g) == "shm", "broadcast has no ring")
    t = torch.full((10,), float(RANK))
    comm.all_reduce(t, group=g)
    agree(bool((t == SIZE * (SIZE - 1) / 2).all()), "ring sum")
    comm.destroy_group(g)


def test_a_bad_forced_algorithm_on_one_rank_raises_on_every_rank(table_file):
    table_file([])
    if RANK == SIZE - 1:
        os.environ[_auto.ENV_ALGORITHM] = "tree"
    g = _fresh()
    msg = expect_error(comm.CommError, comm.all_reduce, torch.ones(4), group=g)
    agree(f"rank {SIZE - 1}: " in msg and "'tree'" in msg, msg)
    comm.destroy_group(g)


def test_auto_against_an_explicit_algorithm_is_a_mismatch(table_file):
    if SIZE == 1:
        pytest.skip("a mismatch needs two ranks")
    table_file([])
    g = _fresh()
    alg = "mpi" if RANK == 0 else "auto"
    msg = expect_error(
        comm.CollectiveMismatchError, comm.all_reduce, torch.ones(4), group=g, algorithm=alg
    )
    agree("algorithm=auto" in msg and "algorithm=mpi" in msg, msg)
    comm.destroy_group(g)


def test_tune_measures_applies_and_caches_privately(tmp_path_factory):
    cache = Path(WORLD.bcast(str(tmp_path_factory.mktemp("cache")) if RANK == 0 else None))
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    try:
        g = _fresh()
        table = comm.tune(g, ops=("all_reduce", "broadcast"), sizes=(4 * KB, 256 * KB), rounds=1)
        r = table["all_reduce"]
        agree(set(r["times"]) == {"mpi", "ring", "shm"}, f"measured {set(r['times'])}")
        agree(all(t > 0 for ts in r["times"].values() for t in ts), "times")
        # What tune found is what auto now picks.
        limits, algs = r["limits"], r["algs"]
        want = algs[0] if not limits or 4 * KB < limits[0] else algs[1]
        agree(comm.auto_choice("all_reduce", 4 * KB, g) == want, "applied")
        WORLD.Barrier()
        path = _auto.cache_path()
        ok = path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600
        rows = json.loads(path.read_text())["machines"][_auto.machine_id()]["rules"]
        ok = ok and {(x["op"], x["ranks"]) for x in rows} == {
            ("all_reduce", SIZE),
            ("broadcast", SIZE),
        }
        agree(ok, f"cache {path}")
        # A new group reads the cache (no table file set): the same rule.
        g2 = _fresh()
        agree(g2._auto is None and comm.auto_choice("all_reduce", 4 * KB, g2) == want, "cached")
        comm.destroy_group(g)
        comm.destroy_group(g2)
    finally:
        if old is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = old


@pytest.mark.parametrize("n", [1, 1000, 300_000])
def test_default_auto_is_correct_for_every_data_op(n):
    # Whatever the shipped table picks at these sizes, the results are right.
    x = torch.full((n,), float(RANK + 1))
    comm.all_reduce(x)
    b = torch.full((n,), float(RANK))
    comm.broadcast(b, src=SIZE - 1)
    out = torch.empty(SIZE * n)
    comm.all_gather_into_tensor(out, torch.full((n,), float(RANK)))
    rs = torch.empty(n)
    comm.reduce_scatter_tensor(rs, torch.ones(SIZE * n))
    ok = bool((x == SIZE * (SIZE + 1) / 2).all()) and bool((b == SIZE - 1).all())
    ok = ok and bool((out.view(SIZE, n) == torch.arange(SIZE).view(SIZE, 1)).all())
    agree(ok and bool((rs == SIZE).all()), f"n={n}")


def test_a_shm_empty_tensor_goes_zero_copy_from_the_threshold():
    g = _fresh()
    n = _auto.ZERO_COPY_MIN // 4  # float32 elements: exactly the zero-copy size
    big = comm.shm_empty(n, group=g)  # in the group's shared memory
    big.fill_(float(RANK + 1))
    comm.all_reduce(big, group=g)
    under = big[: n - 1]  # one element less: the table's pick, as for any tensor
    under.fill_(1.0)
    comm.all_reduce(under, group=g)
    recs = [r for r in metrics.recorder().records("comm") if r["op"] == "all_reduce"][-2:]
    agree(
        bool((big[n - 1 :] == SIZE * (SIZE + 1) / 2).all()) and bool((under == SIZE).all()), "sums"
    )
    want = ["shm", comm.auto_choice("all_reduce", _auto.ZERO_COPY_MIN - 4, g)]
    agree([r["algorithm"] for r in recs] == want, f"{recs} want {want}")
    comm.destroy_group(g)


def test_tuning_some_ops_keeps_the_others_rules(table_file):
    table_file([_row("broadcast", [100], ["mpi", "shm"])])
    g = _fresh()
    comm.auto_choice("broadcast", 1, g)  # sets the group's rules up from the table
    before = g._auto
    comm.tune(g, ops=("all_reduce",), sizes=(4 * KB,), rounds=1, save=False)
    agree(g._auto["broadcast"] == before["broadcast"] == ((100,), ("mpi", "shm")), "kept")
    comm.destroy_group(g)


def test_a_malformed_table_is_a_clear_error_on_every_rank(table_file):
    table_file([_row("all_reduce", [200, 100], ["mpi", "shm", "ring"])])  # limits unsorted
    g = _fresh()
    msg = expect_error(comm.CommError, comm.all_reduce, torch.ones(4), group=g)
    agree("malformed" in msg and "t.json" in msg, msg)
    comm.destroy_group(g)


def test_bad_tune_arguments_are_refused_before_anything_runs():
    expect_error(ValueError, comm.tune, ops=("all_to_all",), match="unknown ops")
    expect_error(ValueError, comm.tune, sizes=(1 << 20, 4096), match="increasing")
    expect_error(ValueError, comm.tune, rounds=0, match="rounds")


def test_a_forced_algorithm_also_holds_for_shm_empty_tensors(table_file):
    table_file([])
    os.environ[_auto.ENV_ALGORITHM] = "mpi"
    g = _fresh()
    big = comm.shm_empty(1 << 18, group=g)
    big.fill_(1.0)
    comm.all_reduce(big, group=g)
    rec = [r for r in metrics.recorder().records("comm") if r["op"] == "all_reduce"][-1]
    agree(rec["algorithm"] == "mpi" and bool((big == SIZE).all()), f"{rec}")
    comm.destroy_group(g)


def _recorded(n: int, op: str = "all_reduce", why: bool = False) -> list[str]:
    """The algorithms the last ``n`` calls of ``op`` ran, as their records name them
    (``why``: with an adaptive call's reason, "ring (probe)"; else the bare name)."""
    names = [r["algorithm"] for r in metrics.recorder().records("comm") if r["op"] == op][-n:]
    return names if why else [a.split(" ")[0] for a in names]


def test_auto_probes_at_the_same_calls_on_every_rank_and_stays_correct(table_file):
    """Large calls adapt: each other algorithm is probed REPS times from the third
    call, every rank runs the same algorithm in every call, sums stay right."""
    from clusterkernel.comm._auto import adapt

    table_file([_row("all_reduce", [], ["mpi"])])  # the table says MPI at every size
    g = _fresh()
    # a round: each other algorithm REPS times in a row, then (the first round) the
    # current one REPS times
    calls = adapt.FIRST_ROUND + 3 * adapt.REPS + 2
    n = adapt.ADAPT_MIN // 4 * 2  # float32: twice the adaptive threshold
    ok = True
    for i in range(calls):
        t = torch.full((n,), float(RANK + i))
        comm.all_reduce(t, group=g)
        ok = ok and bool((t == SIZE * i + SIZE * (SIZE - 1) / 2).all())
    agree(ok, "sums")
    ran = _recorded(calls)
    everyone = WORLD.allgather(ran)
    agree(all(r == ran for r in everyone), f"the ranks ran different algorithms: {everyone}")
    candidates = set(_auto.usable("all_reduce", 1))
    if SIZE > 1:  # one rank: one node, the same candidates (shm and the ring on itself)
        agree(set(ran) == candidates, f"ran {ran}, candidates {candidates}")
        agree(ran[: adapt.FIRST_ROUND - 1] == ["mpi"] * (adapt.FIRST_ROUND - 1), f"{ran}")
    state = comm.auto_state(g)[("all_reduce", adapt.size_class(n * 4))]
    agree(state["why"] in ("probe", "switch") and state["calls"] == calls, f"{state}")
    everyone = WORLD.allgather(state["algorithm"])
    agree(len(set(everyone)) == 1, f"the ranks chose differently: {everyone}")
    comm.destroy_group(g)


def _round(a, g, times: dict) -> list[str]:
    """Arm ``a``'s next probe round, its calls taking ``times`` (seconds by algorithm;
    the current one's calls before it too); what the round ran. It decides (collective
    over ``g``) after its last call, as in a real call."""
    from clusterkernel.comm._auto import adapt

    a.times[a.current].extend([times[a.current]] * adapt.KEEP)  # its calls until now
    a.calls = a.next_round - 1
    ran = []
    while not ran or a.queue:
        ran.append(a.next())
        a.took(g, ran[-1], times[ran[-1]])
    return ran


def test_the_agreed_choice_is_the_fastest_by_its_slowest_rank():
    """A round's decision: the algorithm whose slowest rank is fastest, the same on
    every rank, and only when it beats the current one by the margin (in two rounds
    in a row: the test below)."""
    from clusterkernel.comm._auto import adapt

    g = _fresh()
    a = adapt.Arm(("mpi", "ring", "shm"), "mpi")
    a.seen = set(a.algs)  # set up already: every call is timed
    # mpi 1.0 s everywhere; ring 0.5 s but 3.0 s on the last rank; shm 0.8 s everywhere
    times = {"mpi": 1.0, "ring": 3.0 if RANK == SIZE - 1 else 0.5, "shm": 0.8}
    _round(a, g, times)
    agree(a.current == "mpi" and a.challenger == "shm", f"{a.state()}")
    _round(a, g, times)
    agree(a.current == "shm" and a.why == "switch", f"{a.state()}")
    # the next round: the interval afresh, or later where probing mpi (1.25x shm) would
    # cost more than the budget (ring, 3.75x, is left to its rare rounds)
    wait = max(adapt.INTERVAL_MIN, math.ceil(adapt.REPS * (1.0 - 0.8) / (adapt.BUDGET * 0.8)))
    agree(a.next_round == a.calls + wait, f"{a.state()}")
    b = adapt.Arm(("mpi", "ring"), "mpi")
    b.calls = b.next_round = 10
    b.times["mpi"].extend([1.0] * 3)
    b.times["ring"].extend([0.97] * 3)  # within the margin: kept
    b.probing = ["ring"]
    b._decide(g)
    agree(b.current == "mpi" and b.why == "probe", f"{b.state()}")
    agree(b.interval == 2 * adapt.INTERVAL_MIN, f"{b.state()}")
    comm.destroy_group(g)


def test_one_winning_round_does_not_switch_two_in_a_row_do():
    """A round's winner by the margin is only the challenger: after KEEP more calls of
    the current algorithm a round probes it alone, and the group moves only if it wins
    that one too. A lost second round starts over: the next single win moves nothing."""
    from clusterkernel.comm._auto import adapt

    g = _fresh()
    a = adapt.Arm(("mpi", "ring", "shm"), "mpi")
    a.seen = set(a.algs)
    faster = {"mpi": 1.0, "ring": 1.2, "shm": 0.8}  # shm wins by far more than the margin
    first = _round(a, g, faster)
    agree(set(first) == {"ring", "shm"}, f"the first round probed {first}")
    agree(a.current == "mpi" and a.why == "probe" and a.challenger == "shm", f"{a.state()}")
    agree(a.next_round == a.calls + adapt.KEEP + 1, f"{a.state()}")
    again = _round(a, g, {**faster, "shm": 0.99})  # level with mpi this time: lost
    agree(again == ["shm"] * adapt.REPS, f"the second round probed {again}, not shm alone")
    agree(a.current == "mpi" and a.challenger is None, f"moved on one win: {a.state()}")
    _round(a, g, faster)  # a win again, but not the second in a row
    agree(a.current == "mpi" and a.challenger == "shm", f"{a.state()}")
    _round(a, g, faster)
    agree(a.current == "shm" and a.why == "switch" and a.challenger is None, f"{a.state()}")
    comm.destroy_group(g)


def test_the_next_round_waits_until_its_cost_is_a_small_share_of_the_calls():
    """After a kept choice the next round comes after the doubled interval, or later
    where its expected extra time (the probed algorithms' agreed times, less the
    current one's) would be more than BUDGET of the calls' time until it."""
    from clusterkernel.comm._auto import adapt

    g = _fresh()
    waits = []
    for ring in (1.01, 1.4):  # close: the interval; 1.4x: the budget's wait
        a = adapt.Arm(("mpi", "ring"), "mpi")
        a.calls = a.next_round = 10
        a.times["mpi"].extend([1.0] * 3)
        a.times["ring"].extend([ring] * 3)
        a.probing = ["ring"]
        a._decide(g)
        agree(a.current == "mpi" and a.why == "probe", f"{a.state()}")
        waits.append(a.next_round - 10)
    budget = math.ceil(adapt.REPS * (1.4 - 1.0) / (adapt.BUDGET * 1.0))
    agree(waits == [2 * adapt.INTERVAL_MIN, budget] and budget > waits[0], f"{waits}")
    comm.destroy_group(g)


def test_an_algorithm_that_lost_by_far_is_probed_only_now_and_then():
    from clusterkernel.comm._auto import adapt

    a = adapt.Arm(("mpi", "ring", "shm"), "mpi")
    a.agreed = {"mpi": 1.0, "ring": 3.0, "shm": 1.2}  # ring 3x slower, shm close
    a.probed_at = dict.fromkeys(a.agreed, 0)
    a.calls = a.next_round - 1
    a.times["mpi"].extend([1.0] * adapt.REPS)  # the current one's last calls
    probes = [a.next() for _ in range(adapt.REPS + 1)]
    agree(probes == ["shm"] * adapt.REPS + ["mpi"], f"probed {probes}")
    a.queue, a.probing = [], []
    a.calls, a.next_round = adapt.INTERVAL_MAX - 1, adapt.INTERVAL_MAX
    agree(a.next() == "ring", "after INTERVAL_MAX calls the slow one is tried again")


def test_explicit_forced_async_and_small_calls_never_adapt(table_file):
    """Under the default (adapting), an explicit algorithm= runs what it names in
    every call, also between auto calls of its size class that probe and switch."""
    from clusterkernel.comm._auto import adapt

    table_file([_row("all_reduce", [], ["mpi"])])
    g = _fresh()
    n = adapt.ADAPT_MIN // 4 * 2
    t = torch.ones(n)
    calls = adapt.FIRST_ROUND + 2 * adapt.REPS
    for _ in range(calls):
        comm.all_reduce(t, group=g, algorithm="mpi")  # explicit: never overridden
    agree(_recorded(calls) == ["mpi"] * calls, f"{_recorded(calls)}")
    for _ in range(calls):
        comm.all_reduce(t, group=g, async_op=True).wait()  # async: the current choice
    agree(_recorded(calls) == ["mpi"] * calls, f"{_recorded(calls)}")
    counted = [s["calls"] for s in comm.auto_state(g).values()]
    agree(counted == [0], f"async calls are not counted: {comm.auto_state(g)}")
    small = torch.ones(16)
    for _ in range(calls):
        comm.all_reduce(small, group=g)
    agree(len(comm.auto_state(g)) == 1, f"a small size class adapts: {comm.auto_state(g)}")
    # the arm probes ring and shm; explicit ring calls in between stay the ring's
    rounds = adapt.FIRST_ROUND + 2 * 2 * adapt.REPS + 2
    ran = []
    for _ in range(rounds):
        comm.all_reduce(t, group=g)
        comm.all_reduce(t, group=g, algorithm="ring")
        ran.append(_recorded(2, why=True))
    auto_ran = {a for a, _ in ran}
    agree(all(e == "ring" for _, e in ran), f"explicit ring overridden: {ran}")
    if SIZE > 1:  # the auto calls did probe meanwhile
        agree({"ring (probe)", "shm (probe)"} <= auto_ran, f"auto ran {auto_ran}")
    comm.destroy_group(g)
    os.environ[_auto.ENV_ALGORITHM] = "mpi"
    g = _fresh()
    for _ in range(calls):
        comm.all_reduce(t, group=g)
    agree(_recorded(calls) == ["mpi"] * calls and comm.auto_state(g) == {}, "forced")
    comm.destroy_group(g)


def test_a_blocking_call_returns_once_the_groups_earlier_async_calls_are_done(table_file):
    """An adaptive blocking call is timed until, and returns once, the group's earlier
    async calls of adaptive sizes are done too (what a step waits for): their records
    are written before their wait()."""
    from clusterkernel.comm._auto import adapt

    table_file([_row("all_reduce", [], ["mpi"])])  # the async call: MPI's Iallreduce
    g = _fresh()
    big = torch.full((adapt.ADAPT_MIN * 4,), float(RANK))  # 8 MB, 1 MB: two size classes
    small = torch.ones(adapt.ADAPT_MIN // 4 * 2)
    for _ in range(2):
        before = len(_recorded(10_000))
        work = comm.all_reduce(big, group=g, async_op=True)
        comm.all_reduce(small, group=g)
        done = len(_recorded(10_000)) - before
        agree(done == 2, f"{done} records: the async call was not done")
        work.wait()
        agree(bool((big == SIZE * (SIZE - 1) / 2).all()), "sums")
        big.fill_(float(RANK))
    comm.destroy_group(g)


def test_coalesced_buckets_adapt_like_all_reduce(table_file):
    from clusterkernel.comm._auto import adapt

    table_file([_row("all_reduce", [], ["mpi"])])
    g = _fresh()
    ts = [torch.ones(adapt.ADAPT_MIN // 4) for _ in range(4)]
    calls = adapt.FIRST_ROUND + 2 * adapt.REPS + 2
    for _ in range(calls):
        for x in ts:
            x.fill_(1.0)
        comm.all_reduce_coalesced(ts, group=g, bucket_bytes=1 << 30)
    agree(all(bool((x == SIZE).all()) for x in ts), "sums")
    ran = _recorded(calls, "all_reduce_coalesced")
    everyone = WORLD.allgather(ran)
    agree(all(r == ran for r in everyone), f"{everyone}")
    if SIZE > 1:
        agree(set(ran) == {"mpi", "ring", "shm"}, f"{ran}")
    comm.destroy_group(g)


def test_auto_adapt_0_keeps_the_tables_choice(table_file):
    from clusterkernel.comm._auto import adapt

    os.environ[adapt.ENV_ADAPT] = "0"  # the fixture unsets it
    table_file([_row("all_reduce", [], ["mpi"])])
    g = _fresh()
    t = torch.ones(adapt.ADAPT_MIN // 4 * 2)
    calls = adapt.FIRST_ROUND + 4 * adapt.REPS + 2
    for _ in range(calls):
        comm.all_reduce(t, group=g)
    agree(_recorded(calls) == ["mpi"] * calls and comm.auto_state(g) == {}, "adapted")
    comm.destroy_group(g)


def test_a_group_adapts_by_default_to_the_faster_arm_and_never_mismatches(table_file):
    """Adapting is the default: a group started on a slow choice (the table says the
    ring, at 512 KB, where its 2(n-1) Python-driven steps lose to MPI and shared
    memory) moves, within a few rounds, to the algorithm its slowest rank measured
    fastest in two rounds in a row, every rank in every call alike (check mode
    "every" compares the algorithm each rank is about to run before any data moves)."""
    from clusterkernel.comm._auto import adapt

    if SIZE == 1:
        pytest.skip("on one rank every algorithm is a copy: nothing to move to")
    table_file([_row("all_reduce", [], ["ring"])])
    g = _fresh()
    n = adapt.ADAPT_MIN // 4  # float32: the smallest adaptive size class
    key = ("all_reduce", adapt.size_class(n * 4))
    comm.set_check("every")
    try:
        made, after, ok = 0, 0, True
        while made < 120 and after < 2:  # a few rounds: calls 3, about 17, 35 or 51...
            t = torch.full((n,), float(RANK + made))
            comm.all_reduce(t, group=g)
            ok = ok and bool((t == SIZE * made + SIZE * (SIZE - 1) / 2).all())
            made += 1
            state = comm.auto_state(g)[key]
            after += state["why"] == "switch"  # two calls of the new choice, then stop
    finally:
        comm.set_check("new")
    agree(ok, "sums")
    ran = _recorded(made, why=True)
    everyone = WORLD.allgather((ran, state))
    agree(all(e == (ran, state) for e in everyone), f"the ranks differ: {everyone}")
    secs, now = state["seconds"], state["algorithm"]
    if state["why"] == "switch":
        # what moved, as measured: faster than the ring by the margin in the last round,
        # and probed in two rounds (on an idle machine the ring loses here by far:
        # BENCHMARKS.md, "Collectives")
        agree(now != "ring" and secs[now] < adapt.MARGIN * secs["ring"], f"{state}")
        agree(ran.count(f"{now} (probe)") >= 2 * adapt.REPS, f"moved on one round: {ran}")
        agree(ran[-1] == f"{now} (switch)", f"the records say {ran[-3:]}")
    else:  # a loaded machine can measure no arm faster twice: then it must stay
        stayed = now == "ring" and not any(a.endswith("(switch)") for a in ran)
        agree(stayed, f"moved on noise: {state}")
    comm.destroy_group(g)


def test_whether_a_group_adapts_is_group_rank_0s_answer(table_file):
    """CLUSTERKERNEL_AUTO_ADAPT read per rank would let one rank probe while another
    runs the table's choice (a hang): the group agrees on rank 0's answer instead."""
    from clusterkernel.comm._auto import adapt

    if SIZE == 1:
        pytest.skip("needs two ranks that could disagree")
    table_file([_row("all_reduce", [], ["mpi"])])
    for first in ("0", "1"):
        os.environ[adapt.ENV_ADAPT] = first if RANK == 0 else {"0": "1", "1": "0"}[first]
        g = _fresh()
        t = torch.ones(adapt.ADAPT_MIN // 4)
        calls = adapt.FIRST_ROUND + 2 * 2 * adapt.REPS + 1
        for _ in range(calls):
            comm.all_reduce(t, group=g)
        ran = _recorded(calls)
        agree(all(r == ran for r in WORLD.allgather(ran)), f"adapt={first} on rank 0: {ran}")
        agree((comm.auto_state(g) != {}) == (first == "1"), f"{first}: {comm.auto_state(g)}")
        comm.destroy_group(g)


def test_zero_copy_calls_run_shm_outside_the_arm(table_file):
    """A tensor from shm_empty runs "shm" in place whatever the arm says and is not
    counted (nor timed) in it; plain tensors of the class between them probe as
    usual, and every member's arm is at the same call."""
    from clusterkernel.comm._auto import adapt

    table_file([_row("all_reduce", [], ["mpi"])])
    g = _fresh()
    n = _auto.ZERO_COPY_MIN // 4
    shared = comm.shm_empty(n, group=g)
    plain = torch.empty(n)
    calls = 2 * (adapt.FIRST_ROUND + 2 * 2 * adapt.REPS)
    ok = True
    for i in range(calls):
        t = shared if i % 2 else plain
        t.fill_(1.0)
        comm.all_reduce(t, group=g)
        ok = ok and bool((t == SIZE).all())
    agree(ok, "sums")
    ran = _recorded(calls)
    agree(all(a == "shm" for a in ran[1::2]), f"zero copy: {ran}")
    state = comm.auto_state(g)[("all_reduce", adapt.size_class(n * 4))]
    agree(state["calls"] == calls // 2 and state["why"] != "table", f"{state}")
    everyone = WORLD.allgather((ran, state))
    agree(all(e == (ran, state) for e in everyone), f"the ranks differ: {everyone}")
    if SIZE > 1:  # the plain calls probed
        agree(set(ran[0::2]) == {"mpi", "ring", "shm"}, f"{ran}")
    comm.destroy_group(g)
