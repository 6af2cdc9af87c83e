"""``clusterkernel notebooks DIR`` copies the teaching notebooks out of the package: from
this checkout's (editable) install, and from a wheel built from an sdist of the
checkout and installed into a fresh venv, as a pip user gets it. The command the quick
start ends with (copy them, open JupyterLab) runs as printed with the venv not
activated, and the ``[lab]`` extra that brings JupyterLab is part of ``[dev]``."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from clusterkernel.client.quickstart import next_step

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))


def _cli(*args: str, python: str = sys.executable, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-m", "clusterkernel", *args], capture_output=True, text=True, **kw
    )


def test_copies_every_notebook_and_refuses_to_overwrite(tmp_path):
    dest = tmp_path / "my notebooks"  # made, with its parents' names as given
    done = _cli("notebooks", str(dest))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in dest.iterdir()) == SHIPPED
    assert "00_quickstart.ipynb" in SHIPPED
    for name in SHIPPED:
        assert (dest / name).read_bytes() == (REPO / "notebooks" / name).read_bytes(), name
    assert f"Copied {len(SHIPPED)} notebooks into {dest}" in done.stdout
    # the command to open them, as printed: this venv's jupyter, the path quoted
    assert f"/jupyter lab '{dest / '00_quickstart.ipynb'}'" in done.stdout, done.stdout

    # a second copy would lose the user's edits: refused, nothing written
    edited = dest / "00_quickstart.ipynb"
    edited.write_text("my edits")
    done = _cli("notebooks", str(dest))
    assert done.returncode == 2
    assert "already holds 00_quickstart.ipynb" in done.stderr, done.stderr
    assert "--force" in done.stderr and "nothing was copied" in done.stderr
    assert edited.read_text() == "my edits"

    done = _cli("notebooks", str(dest), "--force")
    assert done.returncode == 0, done.stderr
    assert edited.read_bytes() == (REPO / "notebooks" / "00_quickstart.ipynb").read_bytes()


def test_a_file_in_the_way_is_refused(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    done = _cli("notebooks", str(target))
    assert done.returncode == 2 and "is a file; name a folder" in done.stderr, done.stderr
    done = _cli("notebooks")
    assert done.returncode == 2 and "required: dir" in done.stderr, done.stderr


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _wheel_from_sdist(tmp_path: Path) -> Path:
    """Build an sdist of the checkout, then a wheel from the unpacked sdist (as ``build``)."""
    src = tmp_path / "src"
    skip = shutil.ignore_patterns(
        ".*", "build", "dist", "*.egg-info", "__pycache__", "test-artifacts", "benchmarks"
    )
    shutil.copytree(REPO, src, symlinks=True, ignore=skip)  # symlinks: as git has them
    hook = f"from setuptools import build_meta as b; print(b.build_sdist({str(tmp_path)!r}))"
    sdist = tmp_path / _run([sys.executable, "-c", hook], cwd=src).stdout.split()[-1]
    shutil.unpack_archive(sdist, tmp_path / "unpacked")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    _run([*pip, "-w", str(wheels), str(unpacked)])
    (wheel,) = wheels.glob("clusterkernel-*.whl")
    return wheel


def test_a_wheel_carries_the_notebooks_and_its_command_copies_them(tmp_path):
    wheel = _wheel_from_sdist(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert "clusterkernel/comm/_auto/auto_table.json" in names  # algorithm="auto"'s shipped table
    assert "clusterkernel/client/dashboard/_plot.js" in names  # the dashboard's canvas drawing
    assert sorted(n for n in names if n.startswith("clusterkernel/notebooks/")) == [
        f"clusterkernel/notebooks/{n}" for n in SHIPPED
    ]

    # A fresh venv holding only the wheel's clusterkernel; its dependencies come from
    # this venv's site-packages (a path entry: the checkout's editable hook stays out).
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = str(venv / "bin" / "python")
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    (Path(site.stdout.strip()) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps"]
    _run([*pip, "--no-index", str(wheel)])

    work = tmp_path / "work"
    work.mkdir()
    where = _run([py, "-c", "import clusterkernel; print(clusterkernel.__file__)"], cwd=work)
    assert where.stdout.startswith(str(venv)), where.stdout
    done = _run([str(venv / "bin" / "clusterkernel"), "notebooks", "nbs"], cwd=work)
    assert sorted(p.name for p in (work / "nbs").iterdir()) == SHIPPED, done.stdout
    for name in SHIPPED:
        assert (work / "nbs" / name).read_bytes() == (REPO / "notebooks" / name).read_bytes()


def test_lab_extra_is_in_dev_and_names_jupyterlab():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(req.startswith("jupyterlab") for req in extras["lab"]), extras["lab"]
    assert any(req.startswith("ipykernel") for req in extras["lab"]), extras["lab"]
    assert set(extras["lab"]) <= set(extras["dev"]), "CI installs [dev]: it must hold [lab]"


def _without_the_venv() -> dict[str, str]:
    """This environment as a fresh shell has it: the venv neither activated nor on PATH."""
    venv_bin = os.path.dirname(sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p != venv_bin
    )
    env["BROWSER"] = "true"  # JupyterLab opens "a browser": /bin/true, not Chromium
    return env


def test_the_quick_starts_last_command_runs_as_printed_without_an_activated_venv(tmp_path):
    line = next_step()
    bin_dir = os.path.dirname(sys.executable)
    assert line.startswith(f"{os.path.join(bin_dir, 'clusterkernel')} notebooks my-notebooks && ")
    assert f"{os.path.join(bin_dir, 'jupyter')} lab my-notebooks/00_quickstart.ipynb" in line
    assert ("--allow-root" in line) == (os.geteuid() == 0)  # JupyterLab refuses root without
    env = _without_the_venv()
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")  # its server files, not ~'s
    proc = subprocess.Popen(
        ["bash", "-c", line], cwd=tmp_path, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    seen, url = [], None
    try:
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
            found = re.search(r"(http://127\.0\.0\.1:\d+/)lab\?token=(\w+)", seen[-1])
            if found:
                url = found.groups()
        assert url is not None, "".join(seen)
        assert sorted(p.name for p in (tmp_path / "my-notebooks").iterdir()) == SHIPPED
        # the server it started serves the copied notebook (from its folder)
        base, token = url
        request = urllib.request.Request(
            f"{base}api/contents/00_quickstart.ipynb?content=0",
            headers={"Authorization": f"token {token}"},
        )
        no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        for _ in range(60):  # the server logs its address before it listens there
            try:
                with no_proxy.open(request, timeout=30) as reply:
                    assert json.load(reply)["type"] == "notebook"
                break
            except urllib.error.URLError as e:
                if not isinstance(e.reason, ConnectionRefusedError) or proc.poll() is not None:
                    raise AssertionError(f"{e}; JupyterLab said:\n{''.join(seen)}") from e
                time.sleep(0.5)
        else:
            raise AssertionError(f"nothing listens at {base}; JupyterLab said:\n{''.join(seen)}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
