"""``clusterkernel notebooks DIR`` copies the teaching notebooks out of the package: from
this checkout's (editable) install, and from a wheel built from an sdist of the
checkout and installed into a fresh venv, as a pip user gets it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

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
    assert f"jupyter lab {dest / '00_quickstart.ipynb'}" in done.stdout

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
