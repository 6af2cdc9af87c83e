"""Does a live dashboard slow training (the issue's target: at least 0.97x without)?

    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_dashboard_training.py --rounds 4
    .venv/bin/python benchmarks/bench_dashboard_training.py --config primary --rounds 2

(issue 6.) JupyterLab on loopback with headless Chromium; a notebook trains with the
Trainer (allreduce), alternately without a dashboard (twice: ``without again`` is the
A/A control) and with one live on the page, interleaved, the order turning each round,
plus two runs that split the cost: ``stream`` (a Dashboard receiving, no widgets) and
``hidden`` (widgets redrawn but not shown, so the browser gets the data and draws
nothing). Two configurations (``--config``, ``_dashboard_bed.CONFIGS``), each its own
cluster, server and browser:

- ``primary``: 2 ranks (no more ranks than cores), the issue 4 model and data
  (MLP 784-256-10, 784-input teacher set, global batch 128, SGD lr 0.01);
- ``stress``: 4 ranks on 2 cores, a tiny 20-64-4 MLP (global batch 64): the ranks
  already oversubscribe the machine, so whatever else runs stalls one of them.

A new dashboard first sends the ranks' whole earlier history; that happens before the
timed run (``sync()``), so the figure is the cost of a live dashboard, not of the
catch-up. Reported per run: global samples/s, the kernel's CPU use (its process time /
wall time during the cell), the server's and Chromium's CPU, redraws sent by the
kernel, and how many distinct loss pictures per second the browser drew (sampled every
50 ms in the page); per configuration the ratio of medians against ``without``, whether
it reaches 0.97x, and ``with / without`` paired per round read against the A/A control.
The run-to-run spread of a whole training run here is large (``bench_dashboard_toggle.py``
measures the cost inside one run instead).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402
from _dashboard_bed import CONFIGS, REPO, TRAIN_DEF, tree_cpu  # noqa: E402

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


# What each run has besides the training: nothing (twice); the stream only; the widgets
# redrawn but not on the page (the browser gets the data, draws nothing); all of it.
VARIANTS = {
    "without": "",
    "without again": "",  # the A/A control: two runs of the same code, same round
    "stream": "",
    "hidden": "_w = dash.widget",
    "with": "dash",
}
NO_DASHBOARD = ("without", "without again")


def _cells(config: dict, epochs: int, rounds: int) -> list[str]:
    cells = [
        "%load_ext clusterkernel\nimport clusterkernel\nfrom clusterkernel.client.magics import current_cluster",
        f"%mpi start -n {config['ranks']}\ncluster = current_cluster()\nresults = []\ndash = None",
        TRAIN_DEF.format(**config),
        "%%mpi\nbench_run(1)",  # warm-up
    ]
    for r in range(rounds):
        # interleaved, and the order turns each round so no variant always goes first
        for variant in h.order(list(VARIANTS), r):
            if variant not in NO_DASHBOARD:
                # sync(): the ranks' earlier history goes out now, not inside the timed run
                cells.append("dash = clusterkernel.Dashboard()\ndash.sync()\n" + VARIANTS[variant])
            cells.append(MEASURE.format(epochs=epochs, variant=variant, round=r))
            if variant not in NO_DASHBOARD:
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
            now, cpu = time.monotonic(), tree_cpu()
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


def bench_browser(configs: list[str], epochs: dict[str, int], rounds: int) -> dict:
    from tests.dashboard._browser import browser_page, jupyter_lab

    out = {}
    for name in configs:  # a fresh server and browser each: Lab would reopen the last notebook
        cells = _cells(CONFIGS[name], epochs[name], rounds)
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            with jupyter_lab(root) as (base, token), browser_page() as page:
                out[name] = _drive(page, base, token, root, name, cells)
    return out


def print_browser(results: list[dict], name: str, epochs: int) -> None:
    config = CONFIGS[name]
    print(
        f"\nbrowser, {name}: {config['title']}, Trainer (allreduce), {epochs} epochs of 2048 "
        "samples per run, JupyterLab + headless Chromium"
    )
    med = {v: h.median(r["samples_per_s"] for r in results if r["variant"] == v) for v in VARIANTS}
    print(
        "| run | samples/s (each round) | median vs without | kernel CPU | server CPU "
        "| browser CPU | redraws/s (kernel) | loss pictures/s (browser) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for v in VARIANTS:
        rows = [r for r in results if r["variant"] == v]
        sps = ", ".join(f"{r['samples_per_s']:,.0f}" for r in rows)
        cpu = h.span([100 * r["kernel_cpu"] for r in rows], ".1f")
        red = h.span([r["redraws_per_s"] for r in rows], ".1f")
        pic = h.span([r["browser_pictures_per_s"] for r in rows], ".1f")
        srv = h.span([100 * r["server_cpu"] for r in rows], ".1f")
        brw = h.span([100 * r["browser_cpu"] for r in rows], ".1f")
        print(
            f"| {v} | {sps} | {med[v] / med['without']:.2f}x | {cpu} % | {srv} % | {brw} % "
            f"| {red} | {pic} |"
        )
    by_round: dict[str, dict[int, float]] = {v: {} for v in VARIANTS}
    for r in results:
        by_round[r["variant"]][r["round"]] = r["samples_per_s"]
    both = sorted(set(by_round["with"]) & set(by_round["without"]) & set(by_round["without again"]))

    def paired(v: str) -> tuple[float, float, float]:
        return h.paired([by_round[v][i] for i in both], [by_round["without"][i] for i in both])

    ratio = med["with"] / med["without"]
    verdict = "met" if ratio >= 0.97 else "NOT met"
    pw, aa = paired("with"), paired("without again")
    each = [by_round["with"][i] / by_round["without"][i] for i in both]
    print(
        f"target >= 0.97x with the dashboard shown: {ratio:.3f}x (ratio of medians), {verdict}; "
        f"with / without within each round: {', '.join(f'{p:.2f}x' for p in each)} "
        f"(median {h.fmt_ratio(pw, 3)}); A/A, without again / without: {h.fmt_ratio(aa, 3)}; "
        f"within noise: {h.aa_verdict(pw, aa)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--config",
        choices=(*CONFIGS, "both"),
        default="both",
        help="the realistic run (primary), the 4-rank stress run, or both",
    )
    ap.add_argument(
        "--epochs", type=int, default=None, help="epochs per training run (default: per config)"
    )
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    (REPO / "test-artifacts").mkdir(exist_ok=True)
    configs = list(CONFIGS) if args.config == "both" else [args.config]
    epochs = {c: args.epochs or CONFIGS[c]["epochs"] for c in configs}
    with h.mpi_lock():
        res = bench_browser(configs, epochs, args.rounds)
    print("RESULT browser " + json.dumps(res))
    for name in configs:
        print_browser(res[name], name, epochs[name])


if __name__ == "__main__":
    main()
