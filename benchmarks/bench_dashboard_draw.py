"""Where does the browser's time go: Chromium's CPU per drawing pattern of the dashboard?

    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_dashboard_draw.py --rounds 2

(issue 6.) No MPI: the real panels in JupyterLab + headless Chromium, fed in the
kernel with made-up records at the primary training run's pace (2 ranks, 500 steps/s
each, one all_reduce per step), one cell per drawing pattern (nothing; the loss panel
at 5 Hz, with one line, with 1,000 points; the timeline; throughput + tables; the whole
dashboard at its rates), ``--rounds`` cells of each, interleaved; Chromium's CPU share
over each cell, median and each.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402
from _dashboard_bed import print_browser_cpu, tree_cpu  # noqa: E402

# The browser's share alone, without MPI: the real panels in JupyterLab fed with made-up
# records at the primary run's pace (2 ranks, 500 steps/s each, one all_reduce per step),
# one cell per drawing pattern, Chromium's CPU measured over each cell.
DRAW_SETUP = r"""
import time
from IPython.display import display
from clusterkernel.client.dashboard import MetricsStore
from clusterkernel.client.dashboard._dashboard import SLOW_RATE, TIMELINE_RATE
from clusterkernel.client.dashboard._views import DashboardView

def feed(store, seq, now, ranks=(0, 1)):
    for rank in ranks:
        b = seq * 50
        store.ingest({"rank": rank, "seq": seq, "pc": now, "wall": now,
            "scalar": [(b + i, now, {"loss": 1 / (b + i + 1) + rank, "samples_per_s": 3e4})
                       for i in range(50)],
            "comm": [("all_reduce", 813_000, "mpi", 2, now - 0.1 + i * 0.002, 3e-4, 2e-4)
                     for i in range(50)],
            "proc": {"host": "h", "pid": rank, "cpu": 99.0, "rss_mib": 300.0}})

def draw(panels, secs, ranks=(0, 1), max_points=300):
    store, view = MetricsStore(), DashboardView(max_points=max_points)
    for seq in range(1, 20):
        feed(store, seq, time.time(), ranks)
    display(view.widget)
    due = dict.fromkeys(("timeline", "slow"), 0.0)
    t0, seq = time.monotonic(), 20
    while time.monotonic() - t0 < secs:
        time.sleep(0.1)
        seq += 1
        feed(store, seq, time.time(), ranks)
        now = time.monotonic()
        if "loss" in panels and seq % 2 == 0:  # 5 Hz, as Dashboard(rate=5)
            view.loss.update(store)
        if "timeline" in panels and now >= due["timeline"]:
            due["timeline"] = now + 1 / TIMELINE_RATE
            view.timeline.update(store, [0, 1])
        if "slow" in panels and now >= due["slow"]:
            due["slow"] = now + 1 / SLOW_RATE
            view.throughput.update(store)
            view.comm.update(store)
            view.status.update(store, {0: {"state": "busy"}, 1: {"state": "busy"}})
            view.set_header(f"{seq} messages")
"""

DRAW_PATTERNS = {
    "nothing drawn (page idle)": "time.sleep({secs})",
    "loss panel, 5 Hz": "draw({{'loss'}}, {secs})",
    "loss panel, 5 Hz, one rank's line": "draw({{'loss'}}, {secs}, ranks=(0,))",
    "loss panel, 5 Hz, 1,000 points per line": "draw({{'loss'}}, {secs}, max_points=1000)",
    "timeline alone": "draw({{'timeline'}}, {secs})",
    "throughput + tables alone": "draw({{'slow'}}, {secs})",
    "whole dashboard at its rates": "draw({{'loss', 'timeline', 'slow'}}, {secs})",
}


def bench_draw(secs: float, rounds: int) -> dict[str, list[float]]:
    """Chromium CPU share per drawing pattern, ``rounds`` cells each, interleaved."""
    import tempfile

    import nbformat

    from tests.dashboard._browser import PROMPTS_JS, browser_page, jupyter_lab, lab_run_all
    from tests.dashboard._cells import notebook

    names = list(DRAW_PATTERNS) * rounds
    cells = ["%load_ext clusterkernel", DRAW_SETUP]
    cells += [DRAW_PATTERNS[n].format(secs=secs) for n in names]
    cells.append("print('END')")
    nb = notebook(*cells)
    used: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        nbformat.write(nb, root / "draw.ipynb")
        with jupyter_lab(root) as (base, token), browser_page() as page:
            page.goto(f"{base}/lab/tree/draw.ipynb?token={token}")
            page.wait_for_selector(".jp-NotebookPanel", timeout=60_000)
            lab_run_all(page)
            cell, cell_t, cell_cpu = None, 0.0, 0.0
            deadline = time.monotonic() + 120 + len(names) * (secs + 10)
            while time.monotonic() < deadline:
                prompts = page.evaluate(PROMPTS_JS)
                running = [i for i, p in enumerate(prompts) if "*" in p]
                now_cell = running[0] if running else None
                if now_cell != cell:
                    now, cpu = time.monotonic(), tree_cpu()["browser"]
                    if cell is not None:
                        used[cell] = (cpu - cell_cpu) / (now - cell_t)
                    cell, cell_t, cell_cpu = now_cell, now, cpu
                if prompts and not running and prompts[-1] not in ("[ ]:", "[]:"):
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError("the drawing notebook did not finish")
    out: dict[str, list[float]] = {n: [] for n in DRAW_PATTERNS}
    for i, name in enumerate(names):
        out[name].append(used.get(i + 2, float("nan")))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="cells of each pattern")
    ap.add_argument("--seconds", type=float, default=12.0, help="length of each cell")
    args = ap.parse_args()
    with h.mpi_lock():
        res = bench_draw(args.seconds, args.rounds)
    print("RESULT draw " + json.dumps(res))
    print_browser_cpu(
        f"draw: Chromium CPU per drawing pattern, JupyterLab, no MPI, {args.seconds:g} s cells, "
        "made-up records for 2 ranks at 500 steps/s each",
        res,
    )


if __name__ == "__main__":
    main()
