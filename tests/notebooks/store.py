"""Re-execute the teaching notebooks and store them with their outputs in notebooks/.

The stored outputs are what GitHub shows a reader, and what CI compares a fresh run
with (``tests/notebooks/test_notebooks.py``): after changing a notebook, or anything
that changes what it prints, store it again and commit it. From the repository root,
while no other test starts MPI ranks (here: under the shared lock)::

    python -m tests.notebooks.store                 # every numbered notebook
    python -m tests.notebooks.store 03 09_debugging_ranks   # by number or name

Each run goes through the same :func:`tests.notebooks._run.execute` as the tests,
then :func:`tests.notebooks._stored.for_storage`. Notebook 08 is stored from its run
on the two-node Slurm test bed (as CI compares it), which needs root and Debian's
Slurm packages; without them it is left as it is, saying so.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import nbformat

from tests.notebooks._run import NOTEBOOKS, SLURM_NOTEBOOK, execute
from tests.notebooks._stored import differences, for_storage


def _pick(names: list[str]) -> list[Path]:
    if not names:
        return list(NOTEBOOKS)
    picked = []
    for name in names:
        stem = Path(name).stem
        found = [p for p in NOTEBOOKS if p.stem == stem or p.stem.split("_")[0] == stem]
        if not found:
            known = ", ".join(p.stem for p in NOTEBOOKS)
            raise SystemExit(f"no notebook {name!r} in notebooks/ (there are: {known})")
        picked += found
    return picked


def _slurm_testbed():
    """The started two-node test bed, or the reason there is none here."""
    from tests.slurm._testbed import SlurmTestbed, missing_programs

    if os.geteuid() != 0:
        return None, "the Slurm test bed needs root"
    missing = missing_programs()
    if missing:
        return None, f"the Slurm test bed needs {', '.join(missing)}"
    bed = SlurmTestbed()
    try:
        bed.start()
    except BaseException:
        bed.stop()
        raise
    return bed, ""


def _run(path: Path) -> nbformat.NotebookNode | None:
    with tempfile.TemporaryDirectory(prefix="notebooks-") as work:  # shows in paths
        if path != SLURM_NOTEBOOK:
            return execute(path, Path(work))
        bed, why = _slurm_testbed()
        if bed is None:
            print(f"{path.name}: left as stored: {why} (CI compares its Slurm run)")
            return None
        saved = dict(os.environ)
        try:
            os.environ.update(bed.env)  # the kernel inherits it, as on a login node
            return execute(path, Path(work))
        finally:
            os.environ.clear()
            os.environ.update(saved)
            bed.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.notebooks.store", description=__doc__.splitlines()[0]
    )
    parser.add_argument("notebooks", nargs="*", help="numbers or names (default: all)")
    args = parser.parse_args(argv)
    for path in _pick(args.notebooks):
        fresh = _run(path)
        if fresh is None:
            continue
        old = nbformat.read(path, as_version=4)
        changed = differences(old, fresh)
        nbformat.write(for_storage(fresh), path)
        what = "outputs as stored before" if not changed else "outputs changed:\n" + changed
        print(f"stored {path.name} ({path.stat().st_size // 1024} KiB); {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
