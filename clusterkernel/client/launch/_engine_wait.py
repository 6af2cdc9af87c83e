"""The wait for ``n`` fresh engines after a start or restart (client side).

Example::

    # not run: needs a starting cluster's client and launcher
    infos = wait_for_engines(client, 4, old_pids=set(), timeout=90, query=query,
                             ended=ended, output=output)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ipyparallel as ipp

from clusterkernel.client.errors import ClusterError

# A start taking longer than this (longer than most starts take on a small machine,
# BENCHMARKS.md, "Scale") says how many engines have registered so far, on a live line.
_SAY_PROGRESS_AFTER = 20.0


def wait_for_engines(
    client: ipp.Client,
    n: int,
    *,
    old_pids: set[int],
    timeout: float,
    query: Callable[[list[int]], dict[int, dict] | None],
    ended: Callable[[], bool],
    output: Callable[[], str],
    waiting: Callable[[], str | None] = lambda: None,
    progress: Callable[[str | None], Any] | None = None,
    say_after: float | None = None,
) -> dict[int, dict]:
    """Wait until ``n`` engines answer that were not there before; their identities.

    Restarted engines take the old engine ids, so counting ids is not enough: an
    answer from a new pid is. ``waiting()`` may say why nothing can come yet (a
    job waiting in a queue): that time does not count against ``timeout``, and
    ``progress`` shows it as a live line. ``progress`` also hears how many ranks have
    registered, once the wait is ``say_after`` seconds old (default 20), and None at
    the end if it heard anything.
    """
    if say_after is None:
        say_after = _SAY_PROGRESS_AFTER
    started = time.monotonic()
    deadline = started + timeout
    queued_since: float | None = None
    shown = False
    try:
        while True:
            if ended():
                raise ClusterError(f"The MPI engines failed to start. Their output:\n{output()}")
            why = waiting()
            if why is not None:
                queued_since = queued_since or time.monotonic()
                waited = time.monotonic() - queued_since
                deadline = time.monotonic() + timeout  # the queue's time is not ours
                if progress is not None:
                    progress(f"{why}, {waited:.0f} s")
                    shown = True
                time.sleep(0.5)
                continue
            if time.monotonic() > deadline:
                said = output().strip() or "(nothing yet)"
                raise ClusterError(
                    f"Only {len(client.ids)} of {n} engines registered within {timeout:.0f}s. "
                    f"What the launcher said:\n{said}"
                )
            ids = list(client.ids)
            if progress is not None and time.monotonic() - started >= say_after:
                progress(f"Starting {n} MPI ranks: {min(len(ids), n)} of {n} registered")
                shown = True
            if len(ids) >= n:
                infos = query(ids)
                if infos and all(i["pid"] not in old_pids for i in infos.values()):
                    return infos
            time.sleep(0.05)
    finally:
        if shown and progress is not None:
            progress(None)
