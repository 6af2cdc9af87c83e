"""Output of 16 real MPI ranks stays readable: shared lines once, the rest per rank.

One 16-rank cluster for the module (the session's 4-rank one is stopped first:
one cluster at a time on these machines), checked through the terminal renderer's
printed text, the notebook renderer's model, and a real IPython shell.
"""

from __future__ import annotations

import io
import time

import pytest
from IPython.core.interactiveshell import InteractiveShell

import clusterkernel.client.magics as ck_magics
from clusterkernel import Cluster, RankError
from clusterkernel.client.errors import _ANSI
from clusterkernel.client.output import NotebookRenderer, TerminalRenderer
from tests._labels import per_rank_lines
from tests._procs import wait_no_cluster_processes

N = 16


@pytest.fixture(scope="module")
def cluster16(_shared_holder):
    # What the no_shared_cluster fixture does, at module scope (pytest does not let a
    # module-scoped fixture take that function-scoped one).
    if _shared_holder.cluster is not None:
        _shared_holder.cluster.stop()
        _shared_holder.cluster = None
    left = wait_no_cluster_processes(20)
    assert not left, f"cluster processes still running before the test: {left}"
    c = Cluster(n=N).start()
    yield c
    c.stop()


class TimedStream(io.StringIO):
    """A stream that notes when each line was printed."""

    def __init__(self):
        super().__init__()
        self.times: list[tuple[float, str]] = []

    def write(self, s: str) -> int:
        if s.strip():
            self.times.append((time.monotonic(), s))
        return super().write(s)


PRELUDE = "import time\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.Get_rank()\n"


def test_terminal_prints_a_batch_in_rank_order_with_shared_lines_once(cluster16):
    # Higher ranks print first; one batch (a long hold) must still come out in rank order.
    code = PRELUDE + (
        "time.sleep(0.05 * (15 - r))\nprint(f'hello {r}')\nprint('epoch 3 loss 0.41')\n"
        "if r == 5:\n    print('nan at step 7')\nMPI.COMM_WORLD.Barrier()\nr * 0 + 16"
    )
    out = io.StringIO()
    cluster16.run(code, renderer=TerminalRenderer(cluster16.ranks, stream=out, hold=600))
    assert out.getvalue().splitlines() == [
        *[f"[rank {r}] hello {r}" for r in range(N)],
        "[ranks 0-15] epoch 3 loss 0.41",
        "[rank 5] nan at step 7",
        "Out[ranks 0-15]: 16",
    ]


def test_terminal_streams_and_names_every_rank_once_per_line(cluster16):
    code = PRELUDE + (
        "print('early', flush=True)\nMPI.COMM_WORLD.Barrier()\ntime.sleep(2)\n"
        "print(f'late {r}')\nprint('epoch 3 loss 0.41')"
    )
    stream = TimedStream()
    cluster16.run(code, renderer=TerminalRenderer(cluster16.ranks, stream=stream))
    lines = per_rank_lines(stream.getvalue())
    for r in range(N):
        mine = [text for rank, text in lines if rank == r]
        assert mine == ["early", f"late {r}", "epoch 3 loss 0.41"], (r, stream.getvalue())
    # the hold is short: "early" was on screen long before the cell ended
    early = max(t for t, s in stream.times if "early" in s)
    late = min(t for t, s in stream.times if "late" in s)
    assert late - early > 1.0, stream.getvalue()
    print(stream.getvalue())  # with -s: how a real run grouped at the default hold


def test_notebook_model_shares_identical_lines_and_keeps_rank_5_apart(cluster16):
    code = PRELUDE + (
        "time.sleep(0.02 * (15 - r))\nprint('epoch 3 loss 0.41')\n"
        "if r == 5:\n    print('only rank 5')\nelse:\n    print('ok')\n"
        "import sys\nprint('disk almost full', file=sys.stderr) if r == 9 else None"
    )
    nb = NotebookRenderer(cluster16.ranks)
    cluster16.run(code, renderer=nb)
    shown = nb.shown()
    assert len(shown) == 1 + N
    everyone_but_5 = "0-4,6-15"
    assert shown[0]["text/plain"].splitlines() == [
        "[ranks 0-15]",
        "epoch 3 loss 0.41",
        f"[ranks {everyone_but_5}]",
        "ok",
    ]
    assert "[ranks 0-15]" in shown[0]["text/html"]
    areas = {r: shown[1 + r]["text/plain"] for r in range(N)}
    assert areas[5] == "[rank 5]\nonly rank 5"
    assert areas[9] == "[rank 9]\ndisk almost full"
    assert "ck-err" in shown[1 + 9]["text/html"]
    assert all(areas[r] == "" for r in range(N) if r not in (5, 9))


def test_an_error_on_one_rank_is_headed_rank_not_ranks(cluster16):
    code = PRELUDE + "if r == 1:\n    raise ValueError('one says no')\nif r in (3, 12):\n    1/0"
    with pytest.raises(RankError) as info:
        cluster16.run(code, renderer=TerminalRenderer(cluster16.ranks, stream=io.StringIO()))
    rendered = info.value.render(color=False)
    assert "[rank 1] error: ValueError: one says no" in rendered
    assert "[ranks 3,12] error: ZeroDivisionError: division by zero" in rendered


@pytest.fixture
def shell(cluster16):
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "clusterkernel")
    magics = ck_magics._magics
    magics.cluster = cluster16
    yield sh
    magics.cluster = None  # the module fixture owns the cluster's life


def test_traceback_names_the_users_cell_not_the_engines(shell, capsys):
    shell.execution_count = 500  # far from any engine's own counter
    shell.run_cell("%%mpi --ranks 0,7\nx = 1\n1 / 0", store_history=True)
    shown = _ANSI.sub("", capsys.readouterr().out)
    assert "[ranks 0,7] error: ZeroDivisionError: division by zero" in shown
    assert "Cell In[500], line 2" in shown, shown
    assert "Cell In[" not in shown.replace("Cell In[500]", "")
    assert "----> 2 1 / 0" in shown
