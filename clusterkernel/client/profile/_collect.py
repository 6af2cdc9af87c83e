"""Starting and stopping the ranks' samplers: around one cell, or by hand.

- :class:`CellProfile`: ``%%mpi --profile`` / ``cluster.run(code, profile=True)``;
  the start is queued on each rank ahead of the cell, the stop after it.
- :func:`control`: ``%mpi profile start|stop`` / ``cluster.profile("start"|"stop")``;
  the samplers run across every cell in between (the time between cells, when the
  engine runs no code of the user's, is told apart from the cells' lines), and
  ``stop`` shows the profile and keeps it as ``cluster.profile_result``.

Example::

    cluster.profile("start")
    cluster.run(step_code)
    cluster.run(step_code)
    p = cluster.profile("stop")        # a Profile of both cells, shown
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any

from clusterkernel.client.profile import _live
from clusterkernel.client.profile._model import Profile
from clusterkernel.protocol._errors import ClusterkernelError
from clusterkernel.protocol._names import PROFILE_REQUEST
from clusterkernel.protocol._rank_call import rank_call
from clusterkernel.protocol._targets import PROFILE_START, PROFILE_STOP

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster


class ProfileError(ClusterkernelError, RuntimeError):
    """Profiling asked for in a state that cannot give it (stop without start, ...).

    Example::

        try:
            cluster.profile("stop")
        except ProfileError as e:
            print(e)   # no profile is running: cluster.profile("start") first
    """


class CellProfile:
    """The profile of one running cell (or a by-hand session): started on its ranks,
    collected by :meth:`finish`.

    ``torch=True`` also runs torch.profiler (CPU ops) on each rank (``--profile torch``);
    ``every``: each rank also cuts a snapshot every so many seconds, pulled while the
    cell runs (``_live``; the profile's ``snapshots`` at the end).

    Example::

        cp = CellProfile(cluster, [0, 1, 2, 3])   # before the cell is sent
        ...                                        # the cell runs
        profile = cp.finish()                      # a Profile, shown under the cell
    """

    def __init__(
        self,
        cluster: Cluster,
        ranks: list[int],
        hz: float | None = None,
        torch: bool = False,
        every: float | None = None,
    ) -> None:
        session = _sessions.get(cluster)
        if session is not None:
            raise ProfileError(
                "a profile is already running on this cluster (%mpi profile start); "
                "its stop shows this cell too: run the cell without --profile, or "
                "%mpi profile stop first"
            )
        self.cluster = cluster
        self.ranks = list(ranks)
        kwargs: dict[str, Any] = {} if hz is None else {"hz": hz}
        if torch:
            kwargs["torch"] = True
        if every is not None:
            kwargs["every"] = every
        self._started = cluster.view(self.ranks).apply_async(rank_call, PROFILE_START, **kwargs)
        self._early: dict[int, dict] = {}
        # the dashboard's panel and the snapshots read the running profile through it
        self.live = _live.LiveProfile(cluster, self.ranks, every)
        self.live.begin(self._started)
        _live._running[cluster] = self.live

    def collect_now(self, timeout: float = 3.0) -> None:
        """Stop the samplers of ranks still running the cell and keep what they
        sampled, through the control channel (answered while the cell hangs):
        the runner calls it before it interrupts or restarts stuck ranks."""
        from clusterkernel.client.cluster import _ipp

        engines = {}
        for r in self.ranks:
            try:
                engines[r] = self.cluster.engine_id(r)
            except Exception:  # gone
                pass
        try:
            replies = _ipp.control_request(
                self.cluster.client, engines, PROFILE_REQUEST, {}, timeout
            )
        except Exception:  # the controller is gone: finish() reports the ranks missing
            return
        for r, reply in replies.items():
            if reply.get("status") == "ok" and reply.get("profile"):
                self._early[r] = reply["profile"]

    def finish(self, timeout: float = 10.0, show: bool = True) -> Profile:
        """Stop every rank's sampler and gather the samples; ranks that do not answer
        within ``timeout`` (gone, restarted) are listed as missing, with why; one whose
        snapshots (``every``) were pulled before keeps what they hold."""
        live = self.live
        live.close()
        if live.wanted and not self._early:  # the panel's last picture: up to the cell's end
            try:
                live.pull(window=_live.WINDOW, timeout=1.0)
            except Exception:  # the profile comes first
                pass
        asked: dict[int, Any] = {}
        got: dict[int, dict] = dict(self._early)
        for r in self.ranks:
            if r in got:
                continue
            try:
                asked[r] = self.cluster.view([r]).apply_async(rank_call, PROFILE_STOP)
            except Exception:  # the rank is gone (a restart made new engines)
                pass
        deadline = time.monotonic() + timeout
        for r, ar in asked.items():
            try:
                ar.wait(max(0.0, deadline - time.monotonic()))
                if ar.ready() and ar.successful():
                    data = ar.get()[0]
                    if data:
                        got[r] = data
            except Exception:  # a lost engine answers with an error
                pass
        for r, data in got.items():  # the snapshots the rank still held
            live.absorb(r, data.pop("snapshots", None) or [], data.get("snapshots_dropped", 0))
        missing = [r for r in self.ranks if r not in got]
        notes = _live.lost_reasons(self.cluster, live, missing) if missing else {}
        for r in missing:
            kept = live.merged(r)
            if kept is not None:
                got[r] = kept
                notes[r] += f"; kept what its snapshots hold, up to {_live._clock(kept['until'])}"
        profile = Profile(got, missing=[r for r in missing if r not in got], notes=notes)
        profile.snapshots = live.snapshots()
        if _live._running.get(self.cluster) is live:
            del _live._running[self.cluster]
        _live._ended[self.cluster] = live
        if show:
            profile.show()
        return profile


# cluster -> its by-hand session (weak: a cluster gone takes its entry along)
_sessions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def running(cluster: Cluster) -> bool:
    """Whether ``%mpi profile start`` runs on ``cluster`` now."""
    return cluster in _sessions


def control(
    cluster: Cluster,
    action: str = "start",
    *,
    torch: bool = False,
    hz: float | None = None,
    every: float | str | None = None,
    show: bool = True,
) -> Profile | None:
    """``start``: sample every live rank from now on; ``stop``: end it, show the
    profile and return it (:meth:`Cluster.profile` keeps it as ``profile_result``).

    ``every`` (seconds, or ``"60s"``, ``"5m"``, ``"1h"``; start only): also keep a
    snapshot of every rank over each such window, pulled while cells run, so a
    slowdown at hour two can be read afterwards: :func:`snapshots` (while it runs
    and after), ``profile.snapshots`` (at stop); each a Profile with its start and end.

    Example::

        control(cluster, "start", every="1m")
        cluster.run(code)
        p = control(cluster, "stop")
        p.slowest, p.snapshots[0].start
    """
    if hz is not None and not 0 < hz <= 1000:
        raise ProfileError(f"hz is samples per second, above 0 and at most 1000, not {hz}")
    try:
        secs = None if every is None else _live.parse_every(every)
    except ValueError as e:
        raise ProfileError(str(e)) from None
    if action == "stop" and secs is not None:
        raise ProfileError("every goes with start (cluster.profile('start', every=60)), not stop")
    if action == "start":
        if cluster in _sessions:
            raise ProfileError(
                "a profile is already running: stop it first (%mpi profile stop, "
                "cluster.profile('stop'))"
            )
        session = CellProfile(cluster, list(cluster.live_ranks), hz=hz, torch=torch, every=secs)
        session._started.wait(10.0)  # sampling has begun on every rank when this returns
        _sessions[cluster] = session
        return None
    if action == "stop":
        session = _sessions.pop(cluster, None)
        if session is None:
            raise ProfileError(
                "no profile is running: start one first (%mpi profile start, "
                "cluster.profile('start')), or profile one cell with %%mpi --profile"
            )
        return session.finish(show=show)
    raise ProfileError(
        f"profile action is 'start' or 'stop', not {action!r} (the snapshots of a profile "
        "started with every=...: clusterkernel.client.profile.snapshots(cluster))"
    )
