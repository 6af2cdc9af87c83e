"""Issue 6 benchmark: the live dashboard's channel and its cost to training.

Run (from the repository root; one MPI job at a time on a shared machine):

    flock /tmp/ck-mpi.lock python benchmarks/bench_dashboard.py [--part channel|browser|all]

Part ``channel`` (4 ranks, no browser): every rank logs ``--steps`` scalars in a
tight loop (the worst case for a stream) while the notebook side collects them,
side by side in one cluster:

- ``none``     no stream: the loop's own speed;
- ``zmq``      clusterkernel's channel (``metrics.stream``: signed batches of binary columns over a
               ZMQ PUSH socket per rank, sent from a thread; the recorder is the buffer);
- ``datapub``  ipyparallel's ``publish_data`` from a thread on each rank, 10 times a
               second, each message a window of the last ``--window`` records with a
               sequence number; the notebook reads ``ar.data`` 5 times a second
               (``data_message`` keeps only the latest value per key).

Reported: loop steps/s per rank, the share of (rank, step) points the notebook had
when the cell ended ("live") and after waiting ("final").

Part ``browser``: JupyterLab on loopback with headless Chromium; a notebook trains
with the Trainer (allreduce), alternately without a dashboard and with one live on
the page (interleaved, the order turning each round), plus two runs that split the
cost: ``stream`` (a Dashboard receiving, no widgets) and ``hidden`` (widgets
redrawn but not shown, so the browser gets the data and draws nothing). Two
configurations (``--config``), each its own cluster, server and browser:

- ``primary``: 2 ranks (no more ranks than cores), the issue 4 model and data
  (MLP 784-256-10, 784-input teacher set, global batch 128, SGD lr 0.01);
- ``stress``: 4 ranks on 2 cores, a tiny 20-64-4 MLP (global batch 64): the ranks
  already oversubscribe the machine, so whatever else runs stalls one of them.

A new dashboard first sends the ranks' whole earlier history; that happens before
the timed run (``sync()``), so the figure is the cost of a live dashboard, not of
the catch-up. Reported per run: global samples/s, the kernel's CPU use (its process
time / wall time during the cell), redraws sent by the kernel, and how many distinct
loss pictures per second the browser drew (sampled every 50 ms in the page); per
configuration the ratio of medians against ``without`` and whether it reaches the
issue's 0.97x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


# --------------------------------------------------------------------------- channel
class _Quiet:
    """A renderer that shows nothing (the benchmark reads results itself)."""

    def update(self, rank, out):
        pass

    def notice(self, text):
        pass

    def finish(self):
        pass


LOOP = """
import time
from clusterkernel import metrics
rec = metrics.recorder()
rec.clear()
_t0 = time.perf_counter()
for _i in range({steps}):
    _end = time.perf_counter() + {work}
    while time.perf_counter() < _end:  # the step's own work (0: log only)
        pass
    metrics.log(step=_i, loss=1.0 / (_i + 1), samples_per_s=float(_i))
bench_loop_s = time.perf_counter() - _t0
"""

DATAPUB_START = """
import threading, time
from ipyparallel.datapub import publish_data
from clusterkernel import metrics

def _datapub(stop, window):
    rec, seq = metrics.recorder(), 0
    while not stop.wait(0.1):
        items, nxt, _ = rec.read("scalar", max(rec.total("scalar") - window, 0))
        seq += 1
        publish_data({{"ck": {{"seq": seq, "steps": [s for s, _t, _v in items]}}}})

bench_stop = threading.Event()
bench_thread = threading.Thread(target=_datapub, args=(bench_stop, {window}), daemon=True)
bench_thread.start()
"""

DATAPUB_STOP = "bench_stop.set(); bench_thread.join()"


def _collect_datapub(run, seen: set, stop: threading.Event, ranks: list[int]) -> None:
    """The notebook side of datapub: read the latest window per rank, 5 times a second."""
    while not stop.wait(0.2):
        for rank, data in zip(ranks, run.ar.data):
            window = (data or {}).get("ck")
            if window:
                seen.update((rank, s) for s in window["steps"])


def bench_channel(steps: int, window: int, rounds: int, work: float) -> dict:
    from clusterkernel import Cluster, metrics
    from clusterkernel.dashboard import MetricsStore, Receiver

    out: dict[str, list[dict]] = {"none": [], "zmq": [], "datapub": []}
    with Cluster(n=4, env={"OMP_NUM_THREADS": "1"}) as cluster:
        ranks = cluster.ranks
        total = steps * len(ranks)
        cluster.run("pass", renderer=_Quiet())
        for _ in range(rounds):
            # none
            cluster.run(LOOP.format(steps=steps, work=work), renderer=_Quiet())
            loop = cluster.pull("bench_loop_s")
            out["none"].append({"steps_per_s": statistics.median(steps / t for t in loop.values())})

            # zmq: clusterkernel's stream
            store = MetricsStore()
            rx = Receiver(store).start()
            cluster.view().apply_sync(metrics.stream, rx.address, rx.key, 0.1)
            cluster.run(LOOP.format(steps=steps, work=work), renderer=_Quiet())
            live = sum(len(store.series("loss").get(r, ([],))[0]) for r in ranks)
            seqs = cluster.view().apply_sync(metrics.flush_stream, 30)
            store.wait_for(dict(zip(ranks, seqs)), 30)
            final = sum(len(store.series("loss").get(r, ([],))[0]) for r in ranks)
            loop = cluster.pull("bench_loop_s")
            cluster.view().apply_sync(metrics.stop_stream)
            rx.stop()
            out["zmq"].append(
                {
                    "steps_per_s": statistics.median(steps / t for t in loop.values()),
                    "live": live / total,
                    "final": final / total,
                }
            )

            # datapub: windows of history through ipyparallel's data_message
            seen: set = set()
            stop = threading.Event()
            code = DATAPUB_START.format(window=window) + LOOP.format(steps=steps, work=work)
            code += "time.sleep(0.3)\n" + DATAPUB_STOP  # let the last window go out
            run = cluster.run(code, renderer=_Quiet(), block=False)
            reader = threading.Thread(target=_collect_datapub, args=(run, seen, stop, ranks))
            reader.start()
            run.wait()
            live = len(seen)
            time.sleep(1.0)
            stop.set()
            reader.join()
            _collect_datapub_once(run, seen, ranks)
            loop = cluster.pull("bench_loop_s")
            out["datapub"].append(
                {
                    "steps_per_s": statistics.median(steps / t for t in loop.values()),
                    "live": live / total,
                    "final": len(seen) / total,
                }
            )
    return out


def _collect_datapub_once(run, seen: set, ranks: list[int]) -> None:
    for rank, data in zip(ranks, run.ar.data):
        window = (data or {}).get("ck")
        if window:
            seen.update((rank, s) for s in window["steps"])


def print_channel(res: dict, steps: int, window: int, work: float) -> None:
    what = f"{work * 1e6:.0f} us of work per step" if work else "a tight loop"
    print(f"\nchannel: 4 ranks, {steps} log() calls per rank, {what}; datapub window {window}")
    print(f"{'variant':<9} {'loop steps/s':>13} {'vs none':>8} {'live':>7} {'final':>7}")
    base = statistics.median(r["steps_per_s"] for r in res["none"])
    for name, runs in res.items():
        sps = statistics.median(r["steps_per_s"] for r in runs)
        live = statistics.median(r.get("live", float("nan")) for r in runs)
        final = statistics.median(r.get("final", float("nan")) for r in runs)
        print(f"{name:<9} {sps:>13.0f} {sps / base:>7.2f}x {live:>7.1%} {final:>7.1%}")


# --------------------------------------------------------------------------- encode
def bench_encode(n: int = 20_000, repeat: int = 5) -> dict:
    """Microseconds per record to pack a batch: JSON of the tuples vs the column frames."""
    from clusterkernel import _wire

    items = [
        (i, time.perf_counter(), {"loss": 1.0 / (i + 1), "samples_per_s": float(i)})
        for i in range(n)
    ]
    msg = {"v": _wire.VERSION, "rank": 0, "seq": 1, "scalar": items}

    def best(fn) -> float:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) / n * 1e6

    frames = _wire.encode(b"k", msg)
    return {
        "json_us": best(lambda: json.dumps(items, separators=(",", ":"))),
        "columns_us": best(lambda: _wire.encode(b"k", msg)),
        "decode_us": best(lambda: _wire.decode(b"k", frames)),
        "decode_columns_us": best(lambda: _wire.decode(b"k", frames, columns=True)),
    }


# --------------------------------------------------------------------------- browser
# Two configurations of the same Trainer run (allreduce), each with its own cluster:
# - primary: ranks <= cores, the issue 4 model and data (MLP 784-256-10 on the
#   784-input teacher set of benchmarks/bench_train.py, global batch 128, SGD lr 0.01);
# - stress: 4 busy-polling ranks on 2 cores and a tiny 20-64-4 MLP (global batch 64),
#   so every cycle the notebook, server or browser takes stalls a rank.
CONFIGS = {
    "primary": {
        "ranks": 2,
        "epochs": 150,
        "title": "2 ranks, MLP 784-256-10, global batch 128",
        "data": "teacher(n=2048, in_features=784, classes=10, seed=0)",
        "model": "nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)",
        "batch": 128,
        "lr": 0.01,
    },
    "stress": {
        "ranks": 4,
        "epochs": 60,
        "title": "4 ranks on 2 cores, MLP 20-64-4, global batch 64",
        "data": "teacher(n=2048, in_features=20, classes=4, hidden=16)",
        "model": "nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4)",
        "batch": 64,
        "lr": 0.05,
    },
}

TRAIN_DEF = """%%mpi
import time
import torch
from torch import nn
from clusterkernel.data import teacher
from clusterkernel.train import Trainer
torch.set_num_threads(1)
DATA = {data}

def bench_run(epochs, epoch_ends=None):
    torch.manual_seed(0)
    model = nn.Sequential({model})
    opt = torch.optim.SGD(model.parameters(), lr={lr})
    trainer = Trainer(model, opt, nn.functional.cross_entropy, DATA, batch_size={batch},
                      prefetch=False)
    if epoch_ends is not None:  # wall time of every epoch's end (bench_dashboard_toggle.py)
        trainer.add_hook("on_epoch_end", lambda t: epoch_ends.append(time.time()))
    t0 = time.perf_counter()
    trainer.fit(epochs=epochs)
    return len(DATA) * epochs / (time.perf_counter() - t0)
"""

MEASURE = """import time, json
_c0, _w0 = time.process_time(), time.perf_counter()
_u0 = dash.updates if dash is not None else 0
get_ipython().run_cell_magic("mpi", "", "bench_sps = bench_run({epochs})")
_wall = time.perf_counter() - _w0
results.append({{
    "variant": {variant!r},
    "round": {round},
    "samples_per_s": cluster.pull("bench_sps")[0],
    "kernel_cpu": (time.process_time() - _c0) / _wall,
    "redraws_per_s": ((dash.updates if dash is not None else 0) - _u0) / _wall,
    "wall_s": _wall,
}})
print("DONE {variant}")"""


# What each run has besides the training: nothing; the stream only; the widgets
# redrawn but not on the page (the browser gets the data, draws nothing); all of it.
VARIANTS = {
    "without": "",
    "stream": "",
    "hidden": "_w = dash.widget",
    "with": "dash",
}


def _cells(config: dict, epochs: int, rounds: int) -> list[str]:
    cells = [
        "%load_ext clusterkernel\nimport clusterkernel\nfrom clusterkernel.magics import current_cluster",
        f"%mpi start -n {config['ranks']}\ncluster = current_cluster()\nresults = []\ndash = None",
        TRAIN_DEF.format(**config),
        "%%mpi\nbench_run(1)",  # warm-up
    ]
    for r in range(rounds):
        # interleaved, and the order turns each round so no variant always goes first
        names = list(VARIANTS)
        shift = r % len(names)
        for variant in names[shift:] + names[:shift]:
            if variant != "without":
                # sync(): the ranks' earlier history goes out now, not inside the timed run
                cells.append("dash = clusterkernel.Dashboard()\ndash.sync()\n" + VARIANTS[variant])
            cells.append(MEASURE.format(epochs=epochs, variant=variant, round=r))
            if variant != "without":
                cells.append("dash.close()\ndash = None")
    cells.append(
        "print('RESULTS ' + json.dumps({'using': clusterkernel.__file__, 'runs': results}))"
    )
    cells.append("%mpi stop")
    return cells


def _drive(page, base: str, token: str, root: Path, name: str, cells: list[str]) -> list[dict]:
    """Run ``cells`` as notebook ``name`` in the open page; sample the loss picture."""
    import nbformat

    from tests.dashboard._browser import LOSS_STATE_JS, PROMPTS_JS, lab_run_all
    from tests.dashboard._cells import notebook

    nbformat.write(notebook(*cells), root / f"{name}.ipynb")
    pictures: dict[int, list[float]] = {}  # cell index -> times the loss picture changed
    page.goto(f"{base}/lab/tree/{name}.ipynb?token={token}")
    page.wait_for_selector(".jp-NotebookPanel", timeout=60_000)
    lab_run_all(page)
    last_state = None
    deadline = time.monotonic() + 900
    text = ""
    cell, cell_t, cell_cpu = None, 0.0, {}
    cpu_used: dict[int, dict[str, float]] = {}  # cell index -> CPU share of browser, server
    while time.monotonic() < deadline:
        prompts = page.evaluate(PROMPTS_JS)
        running = [i for i, p in enumerate(prompts) if "*" in p]
        if (running[0] if running else None) != cell:  # a cell began or ended
            now, cpu = time.monotonic(), _tree_cpu()
            if cell is not None:
                cpu_used[cell] = {k: (cpu[k] - cell_cpu[k]) / (now - cell_t) for k in cpu}
            cell, cell_t, cell_cpu = (running[0] if running else None), now, cpu
        state = page.evaluate(LOSS_STATE_JS)
        if running and state != last_state:
            pictures.setdefault(running[0], []).append(time.monotonic())
        last_state = state
        if prompts and not running and prompts[-1] not in ("[ ]:", "[]:"):
            text = page.inner_text(".jp-Notebook")
            break
        time.sleep(0.05)
    page.screenshot(
        path=str(REPO / "test-artifacts" / f"bench_dashboard_{name}.png"), full_page=True
    )
    line = next((ln for ln in text.splitlines() if ln.startswith("RESULTS ")), None)
    if line is None:
        raise RuntimeError(f"the benchmark notebook {name} did not finish:\n{text[-3000:]}")
    got = json.loads(line[len("RESULTS ") :])
    print(f"{name}: the kernel ran {got['using']}", flush=True)
    results = got["runs"]
    measure_cells = [i for i, c in enumerate(cells) if c.startswith("import time, json")]
    for res, idx in zip(results, measure_cells):
        times = pictures.get(idx, [])
        res["browser_pictures_per_s"] = (
            (len(times) - 1) / (times[-1] - times[0]) if len(times) > 2 else 0.0
        )
        res["browser_cpu"] = cpu_used.get(idx, {}).get("browser", float("nan"))
        res["server_cpu"] = cpu_used.get(idx, {}).get("server", float("nan"))
    return results


def _tree_cpu() -> dict[str, float]:
    """CPU seconds so far of Chromium's processes and of the Jupyter server (ours only)."""
    import psutil

    out = {"browser": 0.0, "server": 0.0}
    for proc in psutil.Process().children(recursive=True):
        try:
            name, cmd = proc.name(), " ".join(proc.cmdline())
            times = proc.cpu_times()
        except psutil.Error:
            continue
        if "chrom" in name or "headless_shell" in name:
            out["browser"] += times.user + times.system
        elif "jupyter-lab" in cmd:
            out["server"] += times.user + times.system
    return out


def bench_browser(configs: list[str], epochs: dict[str, int], rounds: int) -> dict:
    import tempfile

    from tests.dashboard._browser import browser_page, jupyter_lab

    out = {}
    for name in configs:  # a fresh server and browser each: Lab would reopen the last notebook
        cells = _cells(CONFIGS[name], epochs[name], rounds)
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            with jupyter_lab(root) as (base, token), browser_page() as page:
                out[name] = _drive(page, base, token, root, name, cells)
    return out


def _span(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}-{hi:{fmt}}"


def print_browser(results: list[dict], name: str, epochs: int) -> None:
    config = CONFIGS[name]
    print(
        f"\nbrowser, {name}: {config['title']}, Trainer (allreduce), {epochs} epochs of 2048 "
        "samples per run, JupyterLab + headless Chromium"
    )
    med = {
        v: statistics.median(r["samples_per_s"] for r in results if r["variant"] == v)
        for v in VARIANTS
    }
    print(
        "| run | samples/s (each round) | median vs without | kernel CPU | server CPU "
        "| browser CPU | redraws/s (kernel) | loss pictures/s (browser) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for v in VARIANTS:
        rows = [r for r in results if r["variant"] == v]
        sps = ", ".join(f"{r['samples_per_s']:,.0f}" for r in rows)
        cpu = _span([100 * r["kernel_cpu"] for r in rows], ".1f")
        red = _span([r["redraws_per_s"] for r in rows], ".1f")
        pic = _span([r["browser_pictures_per_s"] for r in rows], ".1f")
        srv = _span([100 * r["server_cpu"] for r in rows], ".1f")
        brw = _span([100 * r["browser_cpu"] for r in rows], ".1f")
        print(
            f"| {v} | {sps} | {med[v] / med['without']:.2f}x | {cpu} % | {srv} % | {brw} % "
            f"| {red} | {pic} |"
        )
    by_round = {(r["variant"], r["round"]): r["samples_per_s"] for r in results}
    paired = [
        by_round[("with", i)] / by_round[("without", i)]
        for i in sorted({r["round"] for r in results})
        if ("with", i) in by_round and ("without", i) in by_round
    ]
    ratio = med["with"] / med["without"]
    verdict = "met" if ratio >= 0.97 else "NOT met"
    print(
        f"target >= 0.97x with the dashboard shown: {ratio:.3f}x (ratio of medians), {verdict}; "
        f"with / without within each round: {', '.join(f'{p:.2f}x' for p in paired)} "
        f"(median {statistics.median(paired):.3f}x)"
    )


# --------------------------------------------------------------------------- draw
# The browser's share alone, without MPI: the real panels in JupyterLab fed with made-up
# records at the primary run's pace (2 ranks, 500 steps/s each, one all_reduce per step),
# one cell per drawing pattern, Chromium's CPU measured over each cell.
DRAW_SETUP = r"""
import time
from IPython.display import display
from clusterkernel.dashboard import MetricsStore
from clusterkernel.dashboard._dashboard import SLOW_RATE, TIMELINE_RATE
from clusterkernel.dashboard._views import DashboardView

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
                    now, cpu = time.monotonic(), _tree_cpu()["browser"]
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


def print_browser_cpu(title: str, res: dict[str, list[float]]) -> None:
    """A table of Chromium's CPU share per pattern (``--part draw`` and ``--part page``)."""
    print(f"\n{title}")
    print("| pattern | browser CPU (median) | each |")
    print("|---|---|---|")
    for name, values in res.items():
        each = ", ".join(f"{100 * v:.1f}" for v in values)
        print(f"| {name} | {100 * statistics.median(values):.1f} % | {each} |")


# --------------------------------------------------------------------------- page
# The floor: the dashboard's canvas plot (_plot.js) in a bare page, no Jupyter, fed
# in the page with 2 lines of 300 points 5 times a second. What Chromium spends on
# one canvas picture here is the least a live picture can cost it.
PAGE = """<html><body><div id=host style="width:640px"></div><script type=module>
import plot from "./_plot.js";
const state = {xlim: [0, 1500], ylim: [0, 1.6], yticks: [], ytick_format: "",
  title: "loss per rank", xlabel: "step", ylabel: "loss", series: [], data: null};
const handlers = [];
const model = {get: (k) => state[k], on: (e, f) => handlers.push(f), off() {}};
plot.render({model, el: document.getElementById("host")});
let step = 0;
window.feed = (draw) => {
  step += 50;
  const m = Math.min(step, 300), buf = new Float64Array(4 * m);
  for (let r = 0; r < 2; r++) for (let i = 0; i < m; i++) {
    buf[2 * r * m + i] = i * step / m;
    buf[2 * r * m + m + i] = 1 / (1 + i * step / m / 100) + 0.1 * r + 0.1 * Math.random();
  }
  state.data = new DataView(buf.buffer);
  state.series = [0, 1].map((r) => ({n: m, color: r ? "#ff7f0e" : "#1f77b4",
    label: "rank " + r, width: 1.5, kind: "line"}));
  if (draw) handlers.forEach((f) => f());
};
</script></body></html>"""


def bench_page(secs: float, rounds: int) -> dict[str, list[float]]:
    """Chromium CPU share with the plot fed but not redrawn vs redrawn at 5 Hz."""
    import functools
    import http.server
    import shutil
    import tempfile

    from tests.dashboard._browser import browser_page

    out: dict[str, list[float]] = {"fed, not redrawn": [], "redrawn at 5 Hz": []}
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(REPO / "clusterkernel" / "dashboard" / "_plot.js", tmp)
        Path(tmp, "index.html").write_text(PAGE)
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=tmp)
        handler.log_message = lambda *a: None
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            with browser_page() as page:
                page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
                page.wait_for_function("() => window.feed !== undefined")
                for _ in range(rounds):
                    for name, draw in (("fed, not redrawn", "false"), ("redrawn at 5 Hz", "true")):
                        page.evaluate(
                            f"() => {{ clearInterval(window.iv);"
                            f" window.iv = setInterval(() => feed({draw}), 200); }}"
                        )
                        time.sleep(1.0)
                        c0, t0 = _tree_cpu()["browser"], time.monotonic()
                        time.sleep(secs)
                        out[name].append((_tree_cpu()["browser"] - c0) / (time.monotonic() - t0))
        finally:
            server.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--part", choices=("encode", "channel", "browser", "draw", "page", "all"), default="all"
    )
    ap.add_argument("--steps", type=int, default=100_000, help="log() calls per rank (channel)")
    ap.add_argument(
        "--work-us",
        type=float,
        nargs="+",
        default=[0.0, 200.0],
        help="busy work per logged step, microseconds (channel; one table each)",
    )
    ap.add_argument("--window", type=int, default=5_000, help="records per datapub window")
    ap.add_argument(
        "--config",
        choices=(*CONFIGS, "both"),
        default="both",
        help="browser part: the realistic run (primary), the 4-rank stress run, or both",
    )
    ap.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs per training run (browser; default: per configuration)",
    )
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.part in ("encode", "all"):
        res = bench_encode()
        print("RESULT encode " + json.dumps(res))
        print(
            f"\nencode, per scalar record: JSON {res['json_us']:.2f} us, "
            f"column frames {res['columns_us']:.2f} us (decode to tuples {res['decode_us']:.2f} us, "
            f"to columns as the notebook does {res['decode_columns_us']:.3f} us)"
        )
    if args.part in ("channel", "all"):
        for work_us in args.work_us:
            steps = args.steps if not work_us else min(args.steps, int(3e6 / work_us))
            res = bench_channel(steps, args.window, args.rounds, work_us * 1e-6)
            print("RESULT channel " + json.dumps({"work_us": work_us, **res}))
            print_channel(res, steps, args.window, work_us * 1e-6)
    if args.part in ("draw", "all"):
        res = bench_draw(12.0, args.rounds)
        print("RESULT draw " + json.dumps(res))
        print_browser_cpu(
            "draw: Chromium CPU per drawing pattern, JupyterLab, no MPI, 12 s cells, "
            "made-up records for 2 ranks at 500 steps/s each",
            res,
        )
    if args.part in ("page", "all"):
        res = bench_page(15.0, args.rounds)
        print("RESULT page " + json.dumps(res))
        print_browser_cpu("page: the canvas plot alone in a bare page (no Jupyter), 15 s each", res)
    if args.part in ("browser", "all"):
        (REPO / "test-artifacts").mkdir(exist_ok=True)
        configs = list(CONFIGS) if args.config == "both" else [args.config]
        epochs = {c: args.epochs or CONFIGS[c]["epochs"] for c in configs}
        res = bench_browser(configs, epochs, args.rounds)
        print("RESULT browser " + json.dumps(res))
        for name in configs:
            print_browser(res[name], name, epochs[name])


if __name__ == "__main__":
    main()
