"""Real-browser helpers: a Jupyter server (Lab or Voila) on loopback and headless Chromium.

Chromium is Debian's package (``apt-get install chromium``), driven by Playwright
through ``executable_path``; Playwright's own browser download is never used.
Also used by the dashboard benchmarks (``benchmarks/bench_dashboard_draw.py``, ``_page``, ``_training``, ``_toggle``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
BIN = Path(sys.executable).parent
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

# Points the browser drew in each loss line of the dashboard, in rank order: the
# canvas plot notes them on its element after every redraw (_plot.js). The last
# dashboard on the page (a benchmark shows several, one after another).
LOSS_POINTS_JS = """() => {
    const el = Array.from(document.querySelectorAll('.ck-loss.ck-plot')).pop();
    return el && el.dataset.drawn ? el.dataset.drawn.split(',').map(Number) : [];
}"""
# Changes each time the browser redraws the loss picture; cheap to fetch 20 times a second.
LOSS_STATE_JS = """() => {
    const el = Array.from(document.querySelectorAll('.ck-loss.ck-plot')).pop();
    return el ? (el.dataset.frames || '0') + ':' + (el.dataset.drawn || '') : '';
}"""
# The timeline's rank labels as drawn: [[label, pixel row from the top], ...] (_plot.js
# notes them on its element), the last dashboard on the page.
TIMELINE_ROWS_JS = """() => {
    const el = Array.from(document.querySelectorAll('.ck-timeline.ck-plot')).pop();
    if (!el || !el.dataset.yticks) return [];
    return el.dataset.yticks.split(',').map(p => p.split(':')).map(([l, y]) => [l, Number(y)]);
}"""
# Pixels of the loss canvas in each of the given colours (within a small distance,
# for anti-aliasing): proof the lines are on the picture, not only in the model.
LOSS_PIXELS_JS = """(colors) => {
    const c = Array.from(document.querySelectorAll('.ck-loss.ck-plot canvas')).pop();
    if (!c || !c.width) return colors.map(() => 0);
    const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    const rgb = colors.map(h => [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16)));
    const counts = colors.map(() => 0);
    for (let i = 0; i < px.length; i += 4) {
        if (px[i + 3] < 200) continue;
        rgb.forEach((c, k) => {
            if (Math.abs(px[i] - c[0]) + Math.abs(px[i + 1] - c[1]) + Math.abs(px[i + 2] - c[2]) < 40)
                counts[k]++;
        });
    }
    return counts;
}"""


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not os.path.exists(CHROMIUM):
        return "chromium is not installed (apt-get install chromium)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stdout.read()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"server at {url} did not answer within {timeout}s")


def _wait_port(port: int, proc: subprocess.Popen, timeout: float) -> None:
    """Wait until ``port`` accepts connections (Voila has no status URL that runs nothing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stdout.read()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing listens on port {port} after {timeout}s")


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT twice (Jupyter's clean shutdown: kernels too), then SIGKILL the group."""
    if proc.poll() is None:
        for _ in range(2):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@contextmanager
def jupyter_lab(root: Path, timeout: float = 60):
    """Run JupyterLab on loopback in ``root``; yield ``(base_url, token)``."""
    port, token = free_port(), secrets.token_hex(16)
    # a fresh settings dir that turns off the "official Jupyter news?" pop-up
    settings = root / ".settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    cmd = [
        str(BIN / "jupyter"), "lab", "--no-browser", "--allow-root",
        "--ip=127.0.0.1", f"--port={port}", f"--ServerApp.token={token}",
        f"--ServerApp.root_dir={root}", f"--LabApp.workspaces_dir={root / '.ws'}",
        "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "JUPYTERLAB_SETTINGS_DIR": str(root / ".settings"),
        },
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_http(f"{base}/api/status?token={token}", proc, timeout)
        yield base, token
    finally:
        _stop(proc)


@contextmanager
def voila(notebook: Path, env: dict | None = None, timeout: float = 60):
    """Serve ``notebook`` with Voila on loopback; yield its URL."""
    port = free_port()
    cmd = [
        str(BIN / "voila"), str(notebook), "--no-browser", f"--port={port}",
        "--Voila.ip=127.0.0.1", "--show_tracebacks=True",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        cwd=notebook.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={
            **os.environ,
            **(env or {}),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        },
    )
    try:
        base = f"http://127.0.0.1:{port}/"
        _wait_port(port, proc, timeout)
        yield base
    finally:
        _stop(proc)


PROMPTS_JS = """() => Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt'))
    .map(p => p.textContent.trim())"""


def lab_run_all(page, timeout: float = 90) -> None:
    """Wait for the kernel, then Run > Run All Cells until the first cell starts.

    The menu item does nothing while the notebook is still settling, so the click
    is repeated until a prompt shows that a cell ran or runs.
    """
    page.wait_for_selector(
        ".jp-Notebook-ExecutionIndicator[data-status='idle']",
        state="attached",
        timeout=timeout * 1000,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        for _ in range(50):
            if any(p not in ("[ ]:", "[]:") for p in page.evaluate(PROMPTS_JS)):
                return
            time.sleep(0.1)
        page.keyboard.press("Escape")
    raise TimeoutError("Run All Cells did not start the notebook")


@contextmanager
def browser_page(width: int = 1400, height: int = 1100):
    """A headless Chromium page (Debian's chromium through Playwright)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            yield page
        finally:
            browser.close()
