"""The dashboard's profile panel: each rank's top lines over the last seconds, live.

While a profiled cell runs (``%%mpi --profile``, ``%mpi profile start``) and the
dashboard is on show, the panel asks the running profile for its rolling window
(``clusterkernel.client.profile.LiveProfile.want``: only then is it pulled from the
ranks) and shows, per rank, the lines with the most time in the last
``profile._live.WINDOW`` seconds, and what the slowest rank does more than the median
one. When the cell ends its last window stays on show.

Model apart from view: :func:`window_model` turns the running profile into a
:class:`ProfileWindow` (plain values, compared to skip a redraw when nothing
changed); :class:`ProfilePanel` draws one as HTML. Both reuse the profile's own
:class:`~clusterkernel.client.profile.Profile` (``top``, ``difference``, ``where``).

Example::

    panel = ProfilePanel()
    panel.update(cluster)          # the dashboard's drawing thread, every 2 s
    panel.model.ranks[0].lines[0]  # ('cell line 4', 'step', 1.93)
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import ipywidgets as w

from clusterkernel.client.profile import _live

TOP_LINES = 3  # lines per rank: the panel sits among others, the full tables are under the cell


@dataclass(frozen=True)
class RankWindow:
    """One rank's rolling window: its seconds covered and ``(where, function, seconds)``
    of its top lines, most first."""

    rank: int
    seconds: float
    lines: tuple[tuple[str, str, float], ...]


@dataclass(frozen=True)
class ProfileWindow:
    """What the panel shows: ``state`` is ``"none"`` (no profile yet), ``"waiting"``
    (started, no window yet), ``"running"`` or ``"ended"`` (the last window kept);
    ``difference``: ``(where, function, more seconds)`` on ``slowest`` vs ``median``."""

    state: str
    ranks: tuple[RankWindow, ...] = ()
    slowest: int | None = None
    median: int | None = None
    difference: tuple[tuple[str, str, float], ...] = ()

    def functions(self, rank: int) -> list[str]:
        """The functions of ``rank``'s top lines, as shown.

        Example::

            panel.model.functions(0)   # ['step', 'load_batch']
        """
        return [fn for r in self.ranks if r.rank == rank for _w, fn, _s in r.lines]


def window_model(cluster: object, n: int = TOP_LINES) -> ProfileWindow:
    """The panel's model from the profile running on ``cluster`` (or the last one);
    asks it for its rolling window while it runs. Seconds rounded to 0.01 s, so an
    unchanged picture compares equal.

    Example::

        window_model(cluster).state    # 'running'
    """
    live = _live.current(cluster)
    if live is None:
        return ProfileWindow("none")
    if live.running:
        live.want()
    profile = live.window_profile()
    if profile is None:
        return ProfileWindow("waiting" if live.running else "none")
    ranks = tuple(
        RankWindow(
            r,
            round(profile.seconds(r), 1),
            tuple((e.where, e.function, round(e.seconds, 2)) for e in profile.top(r, n)),
        )
        for r in profile.ranks
    )
    slow, med = profile.slowest, profile.median_rank
    diff: tuple[tuple[str, str, float], ...] = ()
    if med is not None and slow != med:
        diff = tuple((d.where, d.function, round(d.extra, 2)) for d in profile.difference(n))
    return ProfileWindow("running" if live.running else "ended", ranks, slow, med, diff)


_HINT = (
    "<div class='ck-profile-panel'><b>profile</b>: <i>none running; %%mpi --profile or "
    "%mpi profile start shows each rank's top lines here while a cell runs</i></div>"
)


class ProfilePanel:
    """Each rank's top lines over the last seconds and the straggler's difference.

    ``model``: the :class:`ProfileWindow` drawn last; ``update`` redraws only when it
    changed.
    """

    def __init__(self, n: int = TOP_LINES) -> None:
        self.n = n
        self.model = ProfileWindow("none")
        self.widget = w.HTML(_HINT)
        self.widget.add_class("ck-profile-view")

    def update(self, cluster: object) -> bool:
        """Redraw from ``cluster``'s profile if its window changed; whether it did."""
        model = window_model(cluster, self.n)
        if model == self.model:
            return False
        self.model = model
        self.widget.value = render(model)
        return True


def _cells(rows, head: tuple[str, ...]) -> str:
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join(
        f"<tr><td class='ck-op'>{html.escape(where)}</td>"
        f"<td class='ck-op'>{html.escape(fn)}</td><td>{secs:.2f}</td></tr>"
        for where, fn, secs in rows
    )
    return f"<table class='ck-table'><tr>{th}</tr>{body}</table>"


def render(model: ProfileWindow) -> str:
    """The panel's HTML for ``model``."""
    if model.state == "none":
        return _HINT
    if model.state == "waiting":
        return "<div class='ck-profile-panel'><b>profile</b>: <i>waiting for the ranks...</i></div>"
    when = "last" if model.state == "running" else "the profiled cell's last"
    secs = max((r.seconds for r in model.ranks), default=0.0)
    parts = [f"<b>profile, {when} {secs:.0f} s</b>"]
    if model.difference:
        parts.append(
            f"<div>rank {model.slowest} (slowest) does more than rank {model.median} "
            f"(median):{_cells(model.difference, ('where', 'function', 'more s'))}</div>"
        )
    cells = "".join(
        f"<div class='ck-profile-rank' style='margin-right:8px;min-width:0'>rank {r.rank}"
        f"{_cells(r.lines, ('where', 'function', 's'))}</div>"
        for r in model.ranks
    )
    parts.append(f"<div style='display:flex;flex-wrap:wrap'>{cells}</div>")
    return "<div class='ck-profile-panel'>" + "".join(parts) + "</div>"
