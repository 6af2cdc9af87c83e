"""What the rank-side libraries above metrics attach to it (rank side).

metrics stands below ``torchdist`` and the rest and imports none of them: a library
that adds to what the recorder sees attaches here when it is imported.

- a *watcher* runs once this process's recorder exists (at once if it does already):
  torchdist's DDP watcher, so that DDP models built afterwards report their gradient
  all-reduces (``torchdist._ddp.watch``);
- a *collector* runs with the recorder each time the metric stream sends (once a
  second at most): torchdist's reading of torch's flight recorder
  (``torchdist._timings.collect``).

``import clusterkernel.torchdist`` attaches both; an engine imports it at its set-up,
before any cell runs.

Example::

    from clusterkernel.metrics import _attached
    _attached.when_recording(_ddp.watch)       # torchdist/__init__.py
    _attached.add_collector(_timings.collect)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_watchers: list[Callable[[], object]] = []
_collectors: list[Callable[[Any], object]] = []
_recording = False  # this process's recorder exists


def when_recording(watch: Callable[[], object]) -> None:
    """Run ``watch()`` once this process records metrics (now, if it does already); once
    per function however often it is attached."""
    if watch in _watchers:
        return
    _watchers.append(watch)
    if _recording:
        watch()


def recording() -> None:
    """The recorder was made (``metrics.recorder``): run the watchers attached so far."""
    global _recording
    _recording = True
    for watch in list(_watchers):
        watch()


def add_collector(collect: Callable[[Any], object]) -> None:
    """Run ``collect(recorder)`` at each send of the metric stream (once per function)."""
    if collect not in _collectors:
        _collectors.append(collect)


def collect(recorder: Any) -> None:
    """Run every collector attached (the metric stream, before it sends)."""
    for fn in list(_collectors):
        fn(recorder)


def collecting() -> bool:
    """Whether any collector is attached."""
    return bool(_collectors)
