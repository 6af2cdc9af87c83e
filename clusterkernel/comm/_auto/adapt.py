"""``algorithm="auto"`` that follows the machine: time what the calls take, now and
then try the other algorithms, and move to the fastest, all ranks of a group together.

The table (:mod:`clusterkernel.comm._auto`) says where a group starts. A machine's
speed changes under a running job: other jobs, a host that moves the ranks' vCPUs
to cores that share no cache, a NUMA placement. So for calls large enough that the
choice matters (from :data:`ADAPT_MIN` bytes) each group keeps, per op and size
class (a power of two of bytes), an :class:`Arm`:

- every blocking call of the class runs the arm's current algorithm and notes how
  long it took on this rank (a tensor from ``shm_empty`` runs ``"shm"``, zero copy,
  outside the arm);
- at fixed call numbers (the 3rd call, then after 16, 32, ... up to every 1024 calls
  of the class) the next few calls are *probes*: each other algorithm runs
  :data:`REPS` times in a row, as it would run if chosen, and is compared with the
  current one's last :data:`KEEP` calls (an algorithm's first call, its set-up, is not
  counted);
- after the last probe the members agree, in one small allreduce, on each
  algorithm's time (the slowest rank's median: a collective ends with its slowest
  member). An algorithm that beats the current one by :data:`MARGIN` is the
  *challenger*: after :data:`KEEP` more calls of the current one (its times all new)
  a round probes it alone, and all move to it only if it wins that round too; a switch starts
  the probe interval afresh, a kept choice doubles it.

Why the members never disagree: everything that says which algorithm a call runs
is data they all share. Whether a group adapts is agreed once, at its first ``auto``
call (group rank 0's answer, with the table); an arm is found by op and size class
(the call's signature); every member counts the same blocking calls of the class in
the same order (the same collectives, in the same order, on every member), so they
probe at the same calls and decide from the same agreed numbers. The one per-rank
input, whether a tensor lives in the group's shared memory (zero copy, outside the
arm), is part of the call: every rank must pass such a tensor (the call's signature
then says "shm"; a rank that does not is a mismatch). Check mode ``"every"``
(:func:`~clusterkernel.comm.set_check`) compares that, and before each adaptive call
moves data the algorithm every member is about to run, and raises
:class:`~clusterkernel.comm.CollectiveMismatchError` on every rank if they differ.
Calls with ``async_op=True`` run the current choice and are not counted or timed
(their time is the caller's, up to ``wait()``). A blocking call is timed until the
group's earlier async calls of adaptive size classes are done too, and returns only
then (:func:`settle`): what a training step waits for is all of them. Through shared
memory that is so anyway (calls on a group run in order), while the ring or MPI runs
beside an earlier call; timed alone, a blocking ring call beat shm in every probe round
and lost in the steps (DataParallel's last bucket, BENCHMARKS.md, "Collectives").
An explicit ``algorithm=`` and ``CLUSTERKERNEL_ALGORITHM`` never adapt;
``CLUSTERKERNEL_AUTO_ADAPT=0`` keeps the table's choice (:func:`enabled`). Algorithms
reduce in different orders, so while a group probes, sums can differ from call to call
in the last bits of a float: pin ``algorithm=`` for bitwise repeatable runs.

The cost is bounded: at most ``REPS * (algorithms - 1)`` probe calls per round,
rounds at most every :data:`INTERVAL_MAX` calls once the choice has settled, an
algorithm the last round found :data:`SLOWER` than the current one by far is tried
again only every :data:`INTERVAL_MAX` calls, and after the first round the next one
waits until what it is expected to cost (the agreed times of the algorithms it will
try, less the current one's) is at most :data:`BUDGET` of the calls' time until it.

Example::

    t = torch.ones(16 << 20)             # 64 MB: an adaptive size class
    for _ in range(40):
        comm.all_reduce(t)
    comm.auto_state()                    # {('all_reduce', 67108864): {'algorithm': 'ring', ...}}
"""

from __future__ import annotations

import math
import os
from collections import deque
from statistics import median

import numpy as np
from mpi4py import MPI

from clusterkernel.comm._begin import step_entry
from clusterkernel.comm._groups import Group
from clusterkernel.comm._ledger import abandon

# Below this many bytes the table's choice (MPI's own, through the C path) stays: an
# adapting call runs in Python, which costs more there than the algorithms differ by
# (BENCHMARKS.md, "Collectives", "The adapting default's costs, measured"). From here
# auto calls run in Python anyway (each one looks for a zero-copy tensor), so an arm
# adds only its own bookkeeping.
ADAPT_MIN = 512 << 10
REPS = 3  # probe calls per other algorithm and round (the median drops a set-up outlier)
FIRST_ROUND = 3  # the call number of the first round: after the first calls' set-up
INTERVAL_MIN, INTERVAL_MAX = 16, 1024
# Move only to an algorithm at least 5 % faster, in two rounds in a row: no flapping on
# noise. With more ranks than cores a call's time is mostly when the others arrive, and
# one round's winner by the margin lost the steps that followed (BENCHMARKS.md,
# "Collectives", "The adapting default at 8 ranks, and the floor measured again").
MARGIN = 0.95
SLOWER = 1.5  # an algorithm this much slower than the current one is probed rarely
KEEP = 5  # the current algorithm's times kept (its median is the comparison)
# A round's expected extra time at most this share of the calls' time before it: where
# the others are close the rounds are cheap and come often, where they lose they come
# late (BENCHMARKS.md, "Collectives", "The adapting default's costs, measured").
BUDGET = 0.03
ENV_ADAPT = "CLUSTERKERNEL_AUTO_ADAPT"
# The flight entry of a round's agreement (the hang report shows ranks waiting there).
DECIDE_LABEL = "auto decision for"


def enabled() -> bool:
    """Whether this rank asks ``auto`` to adapt: yes unless ``CLUSTERKERNEL_AUTO_ADAPT``
    is ``0`` (or ``false``, ``no``, ``off``). Read at a group's first ``auto`` call,
    where the members agree on group rank 0's answer.

    Example: ``CLUSTERKERNEL_AUTO_ADAPT=0`` in the ranks' environment keeps the table's
    choice.
    """
    return os.environ.get(ENV_ADAPT, "1").strip().lower() not in ("0", "false", "no", "off")


class Arm:
    """One op's size class on one group: the current algorithm and the times seen.

    ``why`` says where the current choice comes from: ``"table"`` (the starting rule),
    ``"probe"`` (a round kept it) or ``"switch"`` (two rounds in a row moved to it);
    ``challenger`` is the last round's winner by the margin, which the next round tries
    again (None: none).
    """

    __slots__ = (
        "algs", "start", "current", "why", "calls", "next_round", "interval", "queue", "probing",
        "times", "agreed", "probed_at", "seen", "challenger",
    )  # fmt: skip

    def __init__(self, algs: tuple[str, ...], start: str) -> None:
        self.algs = algs
        self.start = start  # the table's choice
        self.current = start
        self.why = "table"
        self.calls = 0
        self.next_round = FIRST_ROUND
        self.interval = INTERVAL_MIN
        self.queue: list[str] = []
        self.probing: list[str] = []  # the round's other algorithms
        self.times: dict[str, deque] = {a: deque(maxlen=KEEP) for a in algs}
        self.agreed: dict[str, float] = {}  # each algorithm's time as the last round agreed
        self.probed_at: dict[str, int] = {}  # and the call number of that round
        self.seen: set[str] = set()  # algorithms that ran here once (their set-up is done)
        self.challenger: str | None = None

    def next(self) -> str:
        """The algorithm of the next blocking call (the current one, or a probe)."""
        self.calls += 1
        if self.calls == self.next_round:
            if self.challenger is not None:  # the last round's winner, once more alone
                self.probing = [self.challenger]
            else:
                self.probing = [a for a in self.algs if a != self.current and self._worth(a)]
            for a in self.probing:
                self.times[a].clear()  # this round's probes only
            # each algorithm's probes in a row (a, a, a, b, b, b), as its calls would run
            # if chosen: one run between calls of another found the caches and buffers
            # that one left and measured slower than it runs (BENCHMARKS.md,
            # "Collectives", "The adapting default's costs, measured"). The current one
            # is judged by its last calls, a few more where it has too few yet.
            self.queue = [a for a in self.probing for _ in range(REPS)]
            if self.queue and len(self.times[self.current]) < REPS:
                self.queue += [self.current] * REPS
            if not self.queue:  # every other one far slower lately: nothing to try now
                self.next_round = self.calls + self.interval
        return self.queue.pop(0) if self.queue else self.current

    def why_for(self, alg: str) -> str:
        """Why a call runs ``alg`` (what its timing record adds to the algorithm's name):
        ``"probe"`` (a round tries it), ``"switch"`` (a round moved to it from the
        table's choice) or ``""`` (the table's choice)."""
        if alg != self.current:
            return "probe"
        return "" if alg == self.start else "switch"

    def _worth(self, alg: str) -> bool:
        # An algorithm that lost by far (SLOWER) is tried again only every INTERVAL_MAX
        # calls: a round's probes then cost little. Every member reads the same agreed
        # numbers, so all skip or probe alike.
        then, now = self.agreed.get(alg), self.agreed.get(self.current)
        if then is None or now is None or then < SLOWER * now:
            return True
        return self.calls - self.probed_at[alg] >= INTERVAL_MAX

    def took(self, g: Group, alg: str, seconds: float) -> None:
        """Note a blocking call's time; after a round's last call, agree and decide (on
        every member alike)."""
        if alg in self.seen:
            self.times[alg].append(seconds)
        else:  # an algorithm's first call here sets it up (plans, buffers): not its speed
            self.seen.add(alg)
        if self.probing and self.calls >= self.next_round and not self.queue:
            self._decide(g)

    def _decide(self, g: Group) -> None:
        judged = [self.current, *self.probing]
        mine = np.array([median(self.times[a]) if self.times[a] else np.inf for a in judged])
        agreed = np.empty_like(mine)
        entry = step_entry(g, f"{DECIDE_LABEL} {self.current}")
        try:
            g.inner().Allreduce(mine, agreed, MPI.MAX)
        finally:
            abandon(entry)
        for a, t in zip(judged, agreed.tolist(), strict=True):
            self.agreed[a], self.probed_at[a] = t, self.calls
        best = judged[int(np.argmin(agreed))]
        now = self.agreed[self.current]  # inf where no call of it was timed: keep it
        won = best != self.current and math.isfinite(now) and self.agreed[best] < MARGIN * now
        self.probing = []
        if won and best != self.challenger:  # a first win: tried again once the current
            self.challenger, self.why = best, "probe"  # one's KEEP times are all new
            self.next_round = self.calls + KEEP + 1
            return
        self.challenger = None
        if won:  # the second round in a row it won
            self.current, self.why, self.interval = best, "switch", INTERVAL_MIN
            self.times[best].clear()  # its probes were a round's, not a steady state
        else:
            self.why = "probe"
            self.interval = min(2 * self.interval, INTERVAL_MAX)
        self.next_round = self.calls + max(self.interval, self._affordable())

    def _affordable(self) -> int:
        """Calls until the next round may come, for its expected extra time to be at most
        :data:`BUDGET` of theirs (from the agreed times: alike on every member)."""
        now = self.agreed[self.current]
        if not math.isfinite(now) or now <= 0:
            return 0
        extra = sum(
            REPS * (t - now)
            for a, t in self.agreed.items()
            if a != self.current and now < t < SLOWER * now  # the far slower: _worth
        )
        return min(math.ceil(extra / (BUDGET * now)), INTERVAL_MAX)

    def state(self) -> dict:
        """What :func:`auto_state` shows of this arm."""
        return {
            "algorithm": self.current,
            "why": self.why,
            "calls": self.calls,
            "next_probe_at": self.next_round,
            "seconds": dict(self.agreed),  # as the last rounds agreed (the slowest rank's)
            "challenger": self.challenger,
        }


def launched(g: Group, work) -> None:
    """Note an async call of an adaptive size class on ``g`` (its ``Work``, or None
    where it ran inline): a later blocking one waits for it (:func:`settle`)."""
    if work is not None:
        g._in_flight = [w for w in g._in_flight if not w._done]
        g._in_flight.append(work)


def settle(g: Group) -> None:
    """Complete ``g``'s async calls noted by :func:`launched` (on every member alike: the
    same calls). A failed one keeps its error for its own ``wait()``, which raises it."""
    works, g._in_flight = g._in_flight, []
    for w in works:
        w._block()


def size_class(nbytes: int) -> int:
    """The size class of a call of ``nbytes``: the power of two at or above it."""
    return 1 << max(nbytes - 1, 0).bit_length()


def arm(g: Group, op: str, nbytes: int, algs: tuple[str, ...], start: str) -> Arm | None:
    """``g``'s arm for ``op`` calls of ``nbytes`` (None: this call does not adapt).

    ``algs`` are what the call can run on this group, ``start`` the table's choice.
    """
    if nbytes < ADAPT_MIN or len(algs) < 2 or start not in algs:
        return None
    arms = g._adapt
    if arms is None:  # the caller asked enabled() first
        arms = g._adapt = {}
    key = (op, size_class(nbytes))
    found = arms.get(key)
    if found is None:
        found = arms[key] = Arm(algs, start)
    return found


def auto_state(group: Group | None = None) -> dict:
    """What ``algorithm="auto"`` chose on ``group`` (default: every rank), per op and
    size class: the algorithm, why (``table``, ``probe``, ``switch``), the blocking
    calls made, the call number of the next probe round, the median seconds seen, and
    the challenger (the last round's winner, which must win the next round too).

    Local (no communication). Example: ``comm.auto_state()`` after a training loop.
    """
    from clusterkernel.comm._groups import resolve

    g = resolve(group)
    return {key: a.state() for key, a in sorted((g._adapt or {}).items())}
