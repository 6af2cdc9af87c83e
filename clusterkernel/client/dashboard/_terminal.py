"""The dashboard in a terminal IPython: a tqdm line per rank, a summary at the end."""

from __future__ import annotations

import sys
import threading
from collections.abc import Collection

from tqdm import tqdm

from clusterkernel.client.dashboard._store import MetricsStore, blocked_differs


class TerminalProgress:
    """One progress line per rank (step, loss, samples/s), refreshed from a thread.

    Example::

        prog = TerminalProgress(store, ranks=[0, 1]).start()
        ...                       # the cell runs
        print(prog.finish())      # closes the bars, returns the summary text
    """

    def __init__(self, store: MetricsStore, ranks: list[int], rate: float = 5.0, file=None):
        self.store = store
        self.ranks = list(ranks)
        self.rate = rate
        self.file = file if file is not None else sys.stderr
        self._bars: dict[int, tqdm] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> TerminalProgress:
        for i, rank in enumerate(self.ranks):
            self._bars[rank] = tqdm(
                desc=f"rank {rank}", unit="step", position=i, leave=True, file=self.file
            )
        self._thread = threading.Thread(target=self._run, name="clusterkernel-tqdm", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(1.0 / self.rate):
            self.refresh()

    def refresh(self) -> None:
        loss = self.store.last("loss")
        speed = self.store.last("samples_per_s")
        for rank, bar in self._bars.items():
            if rank not in loss:
                continue
            step, value = loss[rank]
            bar.n = int(step)
            post = {"loss": f"{value:.4g}"}
            if rank in speed:
                post["samples/s"] = f"{speed[rank][1]:.0f}"
            bar.set_postfix(post, refresh=False)
            bar.refresh()

    def finish(self) -> str:
        """Stop, close the bars and return :func:`summary` of what was logged."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.refresh()
        for bar in self._bars.values():
            bar.close()
        return summary(self.store)


def _secs(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"  # not measured: blank, never 0


def summary(store: MetricsStore) -> str:
    """A plain-text table: per rank steps, first/last loss, mean samples/s, comm totals."""
    lines = [f"{'rank':>4} {'steps':>7} {'first loss':>11} {'last loss':>10} {'samples/s':>10}"]
    losses = store.series("loss")
    speeds = store.series("samples_per_s")
    for rank in store.ranks():
        steps, loss = losses.get(rank, ([], []))
        speed: Collection[float] = speeds.get(rank, ([], []))[1]
        first = f"{loss[0]:.4g}" if len(loss) else "-"
        last = f"{loss[-1]:.4g}" if len(loss) else "-"
        mean = f"{sum(speed) / len(speed):.0f}" if len(speed) else "-"
        lines.append(f"{rank:>4} {len(steps):>7} {first:>11} {last:>10} {mean:>10}")
    comm = store.comm_table()
    if comm:
        blocked = blocked_differs(comm)
        lines.append(
            f"{'rank':>4} {'op':<16} {'count':>7} {'total s':>9}"
            + (f" {'blocked s':>9}" if blocked else "")
        )
        for r in comm:
            lines.append(
                f"{r['rank']:>4} {r['op']:<16} {r['count']:>7} {r['seconds']:>9.4f}"
                + (f" {_secs(r['wait_s']):>9}" if blocked else "")
            )
    return "\n".join(lines)
