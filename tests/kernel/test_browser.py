"""Real browser: JupyterLab's launcher shows the MPI kernel; a cell in it runs on the ranks.

Debian's chromium driven by Playwright (tests/dashboard/_browser.py); skips, saying
why, only when one of them is missing. A screenshot lands in ``test-artifacts/``.
"""

from __future__ import annotations

import time

import pytest

from tests._procs import cluster_processes, wait_gone
from tests.dashboard._browser import ARTIFACTS, browser_page, chromium_missing, jupyter_lab

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing())),
]

LABEL = "Python 3 (MPI, 2 ranks)"
CELL = "from clusterkernel import comm; print('hello from rank', comm.rank(), 'of', comm.size())"
OUTPUT_JS = """() => Array.from(document.querySelectorAll('.jp-OutputArea-output'))
    .map(o => o.innerText).join('\\n')"""

STATUS_JS = """(want) => Array.from(document.querySelectorAll('.jp-StatusBar-Widget *'))
    .some(e => e.textContent.trim() === want)"""
PROMPT_JS = """() => (document.querySelector('.jp-Notebook .jp-InputPrompt') || {}).textContent"""


def _run_first_cell(page, cell, timeout: float = 60) -> None:
    """Ctrl+Enter in the first cell until its prompt shows it runs or ran.

    Right after the kernel starts, JupyterLab may drop the first run request while
    the notebook settles (the same retry as ``lab_run_all``).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cell.click()
        page.keyboard.press("Control+Enter")
        for _ in range(30):
            if (page.evaluate(PROMPT_JS) or "").strip() not in ("[ ]:", "[]:", ""):
                return
            time.sleep(0.1)
    raise TimeoutError("the cell did not start running")


def test_launcher_tile_opens_a_notebook_whose_cells_run_on_the_ranks(mpi_kernel, tmp_path):
    ARTIFACTS.mkdir(exist_ok=True)
    with jupyter_lab(tmp_path) as (base, token), browser_page() as page:
        page.goto(f"{base}/lab?token={token}")
        tile = page.locator(f'.jp-LauncherCard[data-category="Notebook"][title="{LABEL}"]')
        tile.wait_for(timeout=90_000)
        page.screenshot(path=str(ARTIFACTS / "kernel_launcher.png"))
        tile.click()
        page.wait_for_selector(
            ".jp-Notebook-ExecutionIndicator[data-status='idle']",
            state="attached",
            timeout=90_000,
        )
        page.wait_for_function(STATUS_JS, arg=f"{LABEL} | Idle", timeout=90_000)
        cell = page.locator(".jp-Notebook .jp-Cell .cm-content").first
        cell.click()
        page.keyboard.type(CELL)
        _run_first_cell(page, cell)
        try:
            page.wait_for_function(
                "() => /hello from rank 1 of 2/.test((" + OUTPUT_JS + ")())", timeout=180_000
            )
        finally:
            page.screenshot(path=str(ARTIFACTS / "kernel_lab.png"), full_page=True)
        running = cluster_processes()
        commands = [" ".join(p.cmdline()) for p in running]
        text = page.evaluate(OUTPUT_JS)
        status_bar = page.inner_text(".jp-StatusBar-Widget")

    assert "Started 2 MPI ranks" in text, text
    for rank in (0, 1):
        assert f"[rank {rank}]" in text and f"hello from rank {rank} of 2" in text, text
    assert text.index("[rank 0]") < text.index("[rank 1]")  # in rank order
    assert LABEL in status_bar, status_bar
    assert any("clusterkernel.client.kernel" in c for c in commands), commands
    engine = ("ipyparallel.engine --mpi", "clusterkernel.rank._warm_start --mpi")
    ranks = [c for c in commands if any(e in c for e in engine) and "prterun" not in c]
    assert len(ranks) == 2, commands
    # JupyterLab shut its kernels down when it stopped: the ranks went with them
    left = wait_gone(running, 30)
    assert not left, f"left behind: {[p.cmdline() for p in left]}"
