"""What is the least one live canvas picture costs Chromium (the plot alone in a bare page)?

    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_dashboard_page.py --rounds 3

(issue 6.) The dashboard's canvas plot (``clusterkernel/client/dashboard/_plot.js``) in a bare
page served from a temporary directory, no Jupyter, fed in the page with 2 lines of 300
points 5 times a second, alternately not redrawn and redrawn (interleaved, ``--rounds``
each); Chromium's CPU share over each measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402
from _dashboard_bed import REPO, print_browser_cpu, tree_cpu  # noqa: E402

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
                        c0, t0 = tree_cpu()["browser"], time.monotonic()
                        time.sleep(secs)
                        out[name].append((tree_cpu()["browser"] - c0) / (time.monotonic() - t0))
        finally:
            server.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15.0, help="length of each measurement")
    args = ap.parse_args()
    with h.mpi_lock():
        res = bench_page(args.seconds, args.rounds)
    print("RESULT page " + json.dumps(res))
    print_browser_cpu(
        f"page: the canvas plot alone in a bare page (no Jupyter), {args.seconds:g} s each", res
    )


if __name__ == "__main__":
    main()
