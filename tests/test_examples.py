"""Every example users read runs (issue 26 item 2): the ``Example`` blocks of the public
docstrings and the ```python blocks of README.md and docs/ (collected by ``tests/_examples.py``;
their IPython sessions and ``%mpi?``'s examples run in ``tests/test_docs_run.py``),
one test each, named by the public object (``clusterkernel.comm.all_reduce``) or the
README line of the block.

Where an example runs:

- **on the ranks**: examples of the rank-side modules (comm, partition, data, train,
  metrics, torchdist) and README blocks importing them run on every rank of the
  session's shared 4-rank cluster, as a ``%%mpi`` cell would;
- **in the notebook**: the client side's examples (Cluster's methods, Dashboard,
  export, ...) run in this process; those that mention ``cluster`` get the shared
  cluster, and IPython examples (``%mpi ...``) a real IPython shell whose ``%mpi``
  drives it;
- **with a cluster of their own**: examples that start one (``Cluster(n=2)``,
  ``%mpi start``) run one after another in a single test, after the shared cluster
  is stopped, and must leave no cluster process behind.

Each example runs in a fresh namespace made by its side's setting, :data:`RANK_SETTING`
or :data:`NOTEBOOK_SETTING`: the names the docs assume without defining them
(``model``, ``x``, ``loader``, ``cluster`` ...), bound to small real objects. Each runs
in an empty temporary directory (checkpoints and exported files land there).
Afterwards the harness puts back what an example may change for the whole process:
on a rank the comm check mode, the flight recorder, the registered training modes and
torch.distributed's default group; in the notebook the dashboards an example opened.

Expected-output comments that are complete Python literals are checked:
``batch_shares(64, 3)   # [22, 21, 21]`` fails if the call gives anything else
(``tests._examples.with_checks``). Prose comments are only read.

Not run: an example that cannot run as a unit (it needs a GPU, Slurm, files that are
not here, or it would change this machine for other jobs) says so in its own text, on
a line ``# not run: <why>`` (a doc's block: ``<!-- not run: <why> -->`` on the line
before its fence, which the collection turns into that line). It is still compiled,
its test is skipped with that reason, and :func:`test_examples_not_run_stay_few` keeps their number small. IPython
examples separate notebook cells by blank lines.
"""

from __future__ import annotations

import inspect
import linecache
import re
import time

import pytest

from tests._examples import Example, collect, with_checks
from tests._procs import wait_no_cluster_processes

EXAMPLES, HELP_PROBLEMS = collect()

# at most this many examples may be compiled only (see the module docstring)
MAX_NOT_RUN = 9  # the ninth: torchdist.Keeper, whose build makes an FSDP2 model

RANK_MODULES = ("comm", "partition", "data", "train", "metrics", "torchdist")

# The names that rank-side examples assume, as on a rank after the set-up cells of
# notebook 03: digits data, a small model with its optimizer, this rank's batch.
RANK_SETTING = '''
import os, socket, time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset

import clusterkernel
from clusterkernel import comm, log, metrics, torchdist
from clusterkernel.data import digits, mnist, read_idx, teacher
from clusterkernel.metrics import Recorder
from clusterkernel.partition import *
from clusterkernel.train import *
from clusterkernel.train.comm_hooks import (CommFuture, GradBucket, allreduce_hook,
                                            fp16_compress_hook, fp16_compress_wrapper)


class Net(nn.Sequential):
    """The examples' model: digits' 64 inputs to 10 classes, five layers."""

    def __init__(self):
        super().__init__(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 10))


torch.manual_seed(0)                             # the same weights on every rank
dataset = data = digits()
test_set = Subset(dataset, range(256))
loader = distributed_loader(dataset, global_batch=128, seed=0)   # this rank's share
epoch = 0
x, y = next(iter(loader))                        # this rank's batch of 32
x1, y1, x2, y2 = x[:16], y[:16], x[16:], y[16:]
model = net = Net()                              # the docs call it by both names,
opt = optimizer = torch.optim.SGD(net.parameters(), lr=0.1)   # and its optimizer too
net2 = Net()
opt2 = torch.optim.SGD(net2.parameters(), lr=0.1)
loss_fn = F.cross_entropy
loss_fn(model(x), y).backward()                  # model's gradients are filled
loss = loss_fn(model(x), y)                      # and a loss ready for backward()
t = torch.full((3,), float(comm.rank()))
rec = metrics.recorder()
'''

# The names that notebook-side examples assume: the shared cluster (``cluster``, whose
# ranks hold ``model``), a metrics store with one message from rank 0 in it, a loss
# curve, an IPython configuration object (``c``, as in ipython_config.py).
NOTEBOOK_SETTING = """
import time
from pathlib import Path

import numpy as np
from traitlets.config import Config

import clusterkernel
from clusterkernel import Cluster, ClusterError, Dashboard, RankError
from clusterkernel.client.dashboard import MetricsStore, Receiver, TerminalProgress, thin
from clusterkernel.client.export import export_cells, live_pushes, sbatch_script, write_job

c = Config()
message = {"v": 2, "rank": 0, "seq": 1, "pc": time.perf_counter(), "wall": time.time(),
           "scalar": [(1, time.perf_counter(), {"loss": 0.5})]}   # as rank 0's stream sends
store = MetricsStore()
store.ingest(message)
loss = 1 / np.arange(1, 10_001)
"""

# what ``cluster``'s ranks hold when a notebook-side example starts
RANKS_HOLD = "import torch\nfrom clusterkernel import comm\nmodel = torch.nn.Linear(4, 2)\n"


def _expect(value, expected):
    """The value of an expression whose comment says what it gives (``with_checks``)."""
    got = value.tolist() if hasattr(value, "tolist") else value
    assert got == expected, f"the example gives {got!r}, its comment says {expected!r}"
    return value


_MODS = "|".join(RANK_MODULES)
_RANK_IMPORT = re.compile(rf"^from clusterkernel(\.({_MODS})\b| import .*\b({_MODS})\b)", re.M)


def _side(ex: Example) -> str:
    """'own' (starts a cluster), 'ranks' or 'notebook': where the example runs."""
    if re.search(r"\bCluster\(|^%mpi start", ex.code, re.M):
        return "own"
    if ex.module == "README":  # a block that imports the rank side runs there
        return "ranks" if _RANK_IMPORT.search(ex.code) else "notebook"
    sub = ex.module.split(".")[1] if "." in ex.module else ""
    return "ranks" if sub in RANK_MODULES else "notebook"


def _uses_the_cluster(ex: Example) -> bool:
    """A notebook-side example needs running ranks: it names ``cluster``, opens a
    Dashboard (the session's cluster), or is IPython input (``%mpi`` drives one)."""
    return ex.ipython or bool(re.search(r"\bcluster\b|Dashboard\(", ex.code))


def _params(side: str, shared: bool | None = None) -> list:
    out = []
    for ex in EXAMPLES:
        if _side(ex) == side and (shared is None or _uses_the_cluster(ex) == shared):
            out.append(pytest.param(ex, id=ex.name))
    return out


def _compiled(ex: Example) -> list[str]:
    """The example's cells with checks, compiled (every example must compile); skips,
    saying why, an example marked ``# not run``."""
    cells = [with_checks(c) for c in (ex.cells() if ex.ipython else [ex.code])]
    for py in ex.python():
        compile(py, f"<example {ex.name}>", "exec")
    if ex.not_run:
        pytest.skip(f"not run: {ex.not_run} (compiled)")
    return cells


# ---------------------------------------------------------------- on the ranks


def _run_on_this_rank(name: str, code: str, setting: str, cwd: str) -> None:
    """On one rank: run ``code`` in a fresh namespace made by ``setting``, in ``cwd``,
    then put back what an example may change for the whole process."""
    import linecache
    import os

    from clusterkernel import torchdist
    from clusterkernel.comm import _check, _flight
    from clusterkernel.train import _modes

    saved = (_check.STATE.on, _check.STATE.new, _flight.FLIGHT.size, _flight.FLIGHT.on)
    modes = dict(_modes._MODES)
    filename = f"<example {name}>"  # tracebacks show the example's lines
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    ns = {"__name__": "__example__", "_expect": _expect}  # _expect: sent along, below
    # torchrun's variables afresh (a free port), as each example would get in a job of its
    # own: after an FSDP2 example (its objects outlive destroy_process_group here), the
    # next example's init_process_group() on the same port hung ranks 1-3 in gloo's
    # connect while rank 0 went on
    torchdist.torchrun_env()
    exec(compile(setting, "<rank setting>", "exec"), ns)
    here = os.getcwd()
    os.chdir(cwd)
    try:
        exec(compile(code, filename, "exec"), ns)
    finally:
        os.chdir(here)
        torchdist.shutdown(ns)  # frees a DDP model and the default group it made
        ns.clear()  # (no gc.collect(): 0.3 s a rank, and nothing here needs it)
        _check.STATE.on, _check.STATE.new, size, _flight.FLIGHT.on = saved
        if _flight.FLIGHT.size != size:  # an example resized the ring (comm.set_flight)
            _flight.FLIGHT.resize(size)
        _modes._MODES.clear()
        _modes._MODES.update(modes)


_RANK_RUNNER = inspect.getsource(_expect) + "\n" + inspect.getsource(_run_on_this_rank)


@pytest.mark.parametrize("example", _params("ranks"))
def test_example_on_the_ranks(example: Example, cluster, tmp_path):
    (code,) = _compiled(example)
    call = f"_run_on_this_rank({example.name!r}, {code!r}, {RANK_SETTING!r}, {str(tmp_path)!r})"
    cluster.run(f"{_RANK_RUNNER}\n{call}\ndel _run_on_this_rank, _expect\n", timeout=120)


# ---------------------------------------------------------------- in the notebook


def _run_here(ex: Example, cells: list[str], ns: dict) -> None:
    """Run the example's cells in this process: plain Python with exec, IPython input in
    the real shell (its namespace replaced by ``ns`` meanwhile)."""
    from clusterkernel.client.dashboard import Dashboard

    ns["_expect"] = _expect
    try:
        if not ex.ipython:
            filename = f"<example {ex.name}>"  # tracebacks show the example's lines
            linecache.cache[filename] = (len(cells[0]), None, cells[0].splitlines(True), filename)
            exec(compile(cells[0], filename, "exec"), ns)
            return
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        saved = dict(shell.user_ns)
        shell.user_ns.update(ns)
        try:
            for cell in cells:
                shell.run_cell(cell).raise_error()
        finally:
            ns.update(shell.user_ns)
            shell.user_ns.clear()
            shell.user_ns.update(saved)
    finally:
        for value in list(ns.values()):
            if isinstance(value, Dashboard):
                value.close()


def _magics():
    """The ``%mpi`` magics of this process's IPython shell (loaded on first use)."""
    from IPython.core.interactiveshell import InteractiveShell

    import clusterkernel.client.magics as ck_magics

    InteractiveShell.instance().run_line_magic("load_ext", "clusterkernel")
    return ck_magics._magics


def _notebook_setting(cluster=None) -> dict:
    ns: dict = {"__name__": "__example__"}
    exec(compile(NOTEBOOK_SETTING, "<notebook setting>", "exec"), ns)
    if cluster is not None:
        cluster.run(RANKS_HOLD)
        ns["cluster"] = cluster
    return ns


@pytest.mark.parametrize("example", _params("notebook", shared=False))
def test_example_in_the_notebook(example: Example, tmp_path, monkeypatch):
    cells = _compiled(example)
    monkeypatch.chdir(tmp_path)
    _run_here(example, cells, _notebook_setting())


@pytest.mark.parametrize("example", _params("notebook", shared=True))
def test_example_in_the_notebook_with_the_shared_cluster(
    example: Example, cluster, tmp_path, monkeypatch
):
    cells = _compiled(example)
    monkeypatch.chdir(tmp_path)
    magics = _magics() if example.ipython else None
    if magics is not None:
        magics.cluster = cluster  # as if %mpi start had made it
    try:
        _run_here(example, cells, _notebook_setting(cluster))
    finally:
        if magics is not None:
            magics.cluster = None  # the fixture, not the example, owns the cluster
        # an example may have made a torch.distributed group (cluster.torch_reinit())
        cluster.run("from clusterkernel import torchdist; torchdist.destroy()")


def test_examples_that_start_their_own_cluster(no_shared_cluster, tmp_path, monkeypatch):
    """One test for all of them: a cluster start is the slow part (seconds each)."""
    own = [p.values[0] for p in _params("own")]
    assert own, "no example starts a cluster: the README's Cluster(n=4) block is gone?"
    failures = []
    for ex in own:
        cells = _compiled_or_none(ex)
        if cells is None:
            continue
        where = tmp_path / re.sub(r"\W", "_", ex.name)
        where.mkdir()
        monkeypatch.chdir(where)
        magics = _magics() if ex.ipython else None
        start = time.monotonic()
        try:
            _run_here(ex, cells, _notebook_setting())
        except Exception as e:  # noqa: BLE001 - each example's failure is reported by name
            failures.append(f"{ex.name} ({ex.where}): {type(e).__name__}: {e}")
        finally:
            if magics is not None and magics.cluster is not None:
                magics.cluster.stop()  # as the notebook's kernel shutdown would
                magics.cluster = None
        left = wait_no_cluster_processes(20)
        if left:
            failures.append(f"{ex.name} ({ex.where}) left cluster processes running: {left}")
        print(f"{ex.name}: {time.monotonic() - start:.1f} s")
    assert not failures, "\n".join(failures)


def _compiled_or_none(ex: Example) -> list[str] | None:
    """:func:`_compiled`, or None (with the reason printed) for one not to run."""
    try:
        return _compiled(ex)
    except pytest.skip.Exception as e:
        print(f"{ex.name}: {e}")
        return None


# ---------------------------------------------------------------- the collection


def test_examples_not_run_stay_few():
    not_run = {ex.name: ex.not_run for ex in EXAMPLES if ex.not_run}
    assert len(not_run) <= MAX_NOT_RUN, f"{len(not_run)} examples are not run: {not_run}"


def test_the_collection_finds_the_examples_users_read():
    names = {ex.name for ex in EXAMPLES}
    for name in ("clusterkernel.Cluster", "clusterkernel.comm.all_reduce", "clusterkernel.Trainer"):
        assert name in names, name
    assert sum(ex.module == "README" for ex in EXAMPLES) >= 4
    sides = {_side(ex) for ex in EXAMPLES}
    assert sides == {"ranks", "notebook", "own"}, sides


def test_public_classes_show_their_own_docs_in_help():
    assert not HELP_PROBLEMS, HELP_PROBLEMS
