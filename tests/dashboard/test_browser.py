"""Real browser: JupyterLab and Voila on loopback, driven by headless Chromium.

Needs Debian's ``chromium`` and the ``playwright`` Python package (CI installs
both); the tests skip, saying so, only when one of them is missing. Screenshots
land in ``test-artifacts/``.
"""

from __future__ import annotations

import time

import nbformat
import pytest

from clusterkernel.client.dashboard._views import rank_color
from tests._procs import wait_no_cluster_processes
from tests.dashboard._browser import (
    ARTIFACTS,
    LOSS_PIXELS_JS,
    LOSS_POINTS_JS,
    LOSS_STATE_JS,
    TIMELINE_ROWS_JS,
    browser_page,
    chromium_missing,
    jupyter_lab,
    lab_run_all,
    voila,
)
from tests.dashboard._cells import notebook, train_cell

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing())),
]

EPOCHS = 25  # 32 steps each: 800 points per rank, below the drawn max of 1000
RUNNING_JS = """() => Array.from(document.querySelectorAll('.jp-CodeCell'))
    .map(c => (c.querySelector('.jp-InputPrompt') || {}).textContent || '')"""
# The dashboard's profile panel as the browser shows it (the last dashboard on the page)
PROFILE_PANEL_JS = """() => {
    const el = Array.from(document.querySelectorAll('.ck-dashboard .ck-profile-panel')).pop();
    return el ? el.innerText : '';
}"""


def test_lab_shows_every_rank_loss_growing_while_the_cell_runs(no_shared_cluster, tmp_path):
    nb = notebook(
        "%load_ext clusterkernel",
        "%mpi start -n 4",
        # profiled from here on (the profile panel shows it; no profile under the cell,
        # which would push the last cells out of JupyterLab's text)
        "import clusterkernel\ndash = clusterkernel.Dashboard(max_points=1000)\n"
        "%mpi profile start\ndash",
        train_cell(EPOCHS, magic="%%mpi"),
        "dash.sync()\nprint('steps', sorted(len(s) for s, _ in dash.store.series('loss').values()))",
        "%mpi stop",
    )
    nbformat.write(nb, tmp_path / "x.ipynb")
    ARTIFACTS.mkdir(exist_ok=True)
    samples = []  # (time, points per line, prompts) while the training cell runs
    panel_texts = []  # the profile panel's text while it runs
    with jupyter_lab(tmp_path) as (base, token), browser_page() as page:
        page.goto(f"{base}/lab/tree/x.ipynb?token={token}")
        page.wait_for_selector(".jp-NotebookPanel", timeout=60_000)
        lab_run_all(page)
        page.wait_for_selector(".ck-loss", state="attached", timeout=120_000)
        deadline = time.monotonic() + 120
        states = set()
        while time.monotonic() < deadline:
            prompts = page.evaluate(RUNNING_JS)
            points = page.evaluate(LOSS_POINTS_JS)
            states.add(page.evaluate(LOSS_STATE_JS))
            training = len(prompts) > 3 and "*" in prompts[3]
            samples.append((time.monotonic(), points, training))
            if training:
                panel_texts.append(page.evaluate(PROFILE_PANEL_JS))
            if len(prompts) > 5 and prompts[5].strip() not in ("[ ]:", "[*]:", "[]:"):
                break  # the last cell ran
            time.sleep(0.1)
        page.screenshot(path=str(ARTIFACTS / "dashboard_lab.png"), full_page=True)
        final = page.evaluate(LOSS_POINTS_JS)
        panel_final = page.evaluate(PROFILE_PANEL_JS)
        pixels = page.evaluate(LOSS_PIXELS_JS, [rank_color(r) for r in range(4)])
        rows = page.evaluate(TIMELINE_ROWS_JS)
        # read at full width: in a narrow window the taller dashboard pushes the last
        # cells out of view, and JupyterLab leaves cells out of view out of the text
        text = page.inner_text(".jp-Notebook")
        html = page.content()
        tables = _tables_at_widths(page, (1400, 900, 800))
        fits = {width: _fit_at(page, width) for width in (900, 800)}
    (ARTIFACTS / "dashboard_lab.html").write_text(html)

    during = [(t, p) for t, p, running in samples if running and len(p) == 4 and min(p) >= 2]
    assert during, f"no moment with 4 loss lines while the cell ran: {samples[-5:]}"
    first_t, first = during[0]
    last_t, last = during[-1]
    assert all(b > a for a, b in zip(first, last)), (
        f"lines did not grow while the cell ran: {first} -> {last}"
    )
    assert len(during) >= 3 and last_t > first_t
    steps = 32 * EPOCHS
    assert "dashboard error" not in text
    assert "steps [800, 800, 800, 800]".replace("800", str(steps)) in text
    assert final == [steps] * 4, final  # every step of every rank is drawn at the end
    assert len(states) > 3  # the browser saw the picture change several times
    # the profile panel: each rank's top lines while the profiled cell ran (the time
    # lands on the cell's trainer.fit line, function <module>: the Trainer is a library)
    live = [t for t in panel_texts if "profile, last" in t and "Cell In[" in t]
    assert live and "<module>" in live[-1] and "rank 3" in live[-1], panel_texts[-3:]
    assert "rank 0" in panel_final, panel_final
    assert min(pixels) > 50, f"pixels of each rank's colour on the loss canvas: {pixels}"
    # the timeline's rows as drawn: rank 0 on top, then 1, 2, 3 downwards
    assert [label for label, _ in rows] == ["0", "1", "2", "3"], rows
    tops = [y for _, y in rows]
    assert all(a < b for a, b in zip(tops, tops[1:])), f"rank rows top to bottom: {rows}"
    for width, (comm, status, browser_open) in tables.items():
        assert browser_open, f"the file browser was not open at {width} px"
        side_by_side = status["left"] >= comm["right"] - 1
        stacked = status["top"] >= comm["bottom"] - 1
        assert side_by_side or stacked, f"at {width} px the tables overlap: {comm} {status}"
    for width, fit in fits.items():  # JupyterLab's file browser open, as a user has it
        assert fit["browser_open"] and fit["dashboard_width"] > 250, (width, fit)
        assert not fit["scrolls"], f"at {width} px these scroll sideways: {fit['scrolls']}"
        assert not fit["sticks_out"], f"at {width} px these stick out: {fit['sticks_out']}"
        assert not fit["wrapped_headers"], f"at {width} px: {fit['wrapped_headers']}"
        for plot, ticks in fit["ticks"].items():  # readable axes: 2+ distinct labels each
            for axis in ("x", "y"):
                labels = ticks[axis]
                assert len(labels) >= 2 and len(set(labels)) == len(labels), (width, plot, ticks)
    print(f"browser saw {len(states)} pictures; {len(during)} samples while training")
    left = wait_no_cluster_processes(30)
    assert not left, f"left behind: {[p.cmdline() for p in left]}"


TABLE_BOXES_JS = """() => {
    const box = (sel) => { const r = document.querySelector(sel).getBoundingClientRect();
        return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
    const browser = document.querySelector('#filebrowser');
    return [box('.ck-comm-table'), box('.ck-status'),
            !!browser && browser.getBoundingClientRect().width > 0];
}"""


def _tables_at_widths(page, widths) -> dict:
    """The comm and status tables' boxes at each viewport width, the file browser open."""
    if not page.evaluate(TABLE_BOXES_JS)[2]:
        page.click("[data-id='filebrowser']")  # the left sidebar's file browser tab
    out = {}
    for width in widths:
        page.set_viewport_size({"width": width, "height": 1000})
        time.sleep(0.5)  # a relayout
        page.screenshot(path=str(ARTIFACTS / f"dashboard_lab_{width}.png"), full_page=True)
        out[width] = page.evaluate(TABLE_BOXES_JS)
    return out


# What a narrow notebook must not do to the dashboard (the last one on the page): an
# element that scrolls sideways (scrollWidth > clientWidth), one whose right edge lies
# past the dashboard's or its own panel's (clipped: the metric drop-down, the comm
# table's last column), a table header on two lines; and each plot's tick labels.
FIT_JS = """() => {
    const dash = Array.from(document.querySelectorAll('.ck-dashboard')).pop();
    const name = (e) => e.tagName.toLowerCase() + (e.className && e.className.baseVal === undefined
        ? '.' + String(e.className).trim().split(/\\s+/).slice(0, 2).join('.') : '')
        + (e.textContent ? ' "' + e.textContent.trim().slice(0, 20) + '"' : '');
    const right = dash.getBoundingClientRect().right;
    const scrolls = [], sticks_out = [], wrapped_headers = [];
    for (const e of [dash, ...dash.querySelectorAll('*')]) {
        const box = e.getBoundingClientRect();
        if (box.width === 0 || getComputedStyle(e).display === 'none') continue;
        if (e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 0) scrolls.push(name(e));
        if (box.right > right + 1) sticks_out.push(name(e) + ' ' + Math.round(box.right - right) + 'px');
        const panel = e.closest('.widget-html, .ck-plot, .widget-dropdown');
        if (panel && panel !== e && box.right > panel.getBoundingClientRect().right + 1)
            sticks_out.push(name(e) + ' past its panel');
    }
    for (const th of dash.querySelectorAll('th')) {
        const line = parseFloat(getComputedStyle(th).lineHeight) || 16;
        if (th.getBoundingClientRect().height > 1.6 * line + 8) wrapped_headers.push(th.textContent);
    }
    const ticks = {};
    for (const plot of dash.querySelectorAll('.ck-plot')) {
        const key = Array.from(plot.classList).find(c => c !== 'ck-plot' && c.startsWith('ck-'));
        ticks[key] = {x: (plot.dataset.xticks || '').split(',').filter(Boolean),
                      y: (plot.dataset.yticks || '').split(',').filter(Boolean).map(t => t.split(':')[0])};
    }
    const browser = document.querySelector('#filebrowser');
    return {scrolls, sticks_out, wrapped_headers, ticks, dashboard_width: Math.round(dash.getBoundingClientRect().width),
            browser_open: !!browser && browser.getBoundingClientRect().width > 0};
}"""


def _fit_at(page, width: int) -> dict:
    """:data:`FIT_JS` at ``width`` px, the file browser open, once the plots redrew."""
    page.set_viewport_size({"width": width, "height": 1000})
    time.sleep(1.0)  # a relayout, and a redraw of each canvas at its new size
    page.screenshot(path=str(ARTIFACTS / f"dashboard_lab_fit_{width}.png"), full_page=True)
    return page.evaluate(FIT_JS)


def test_voila_serves_the_dashboard_app(no_shared_cluster):
    from pathlib import Path

    app = Path(__file__).resolve().parents[2] / "notebooks" / "dashboard_app.ipynb"
    env = {"CK_DASHBOARD_RANKS": "2", "CK_DASHBOARD_EPOCHS": "40"}
    with voila(app, env=env) as url, browser_page() as page:
        page.goto(url, timeout=120_000)
        page.wait_for_selector(".ck-dashboard", state="attached", timeout=120_000)
        deadline = time.monotonic() + 60
        points: list[int] = []
        while time.monotonic() < deadline:
            points = page.evaluate(LOSS_POINTS_JS)
            if len(points) == 2 and min(points) >= 2:
                break
            time.sleep(0.2)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard_voila.png"), full_page=True)
        body = page.inner_text("body")
    assert len(points) == 2 and min(points) >= 2, points
    assert "loss per rank" in body and "timeline" in body
    assert "Traceback" not in body and "Error" not in body and "error" not in body
    left = wait_no_cluster_processes(30)
    assert not left, f"left behind: {[p.cmdline() for p in left]}"
