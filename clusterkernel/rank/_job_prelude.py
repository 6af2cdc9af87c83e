"""The head of every script ``clusterkernel export`` writes (not imported: its text is copied).

Runs on each rank of the batch job: labels every line the rank prints ``[rank N] ``
as the notebook does, gives it torchrun's environment (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ...) and its GPU by the call that gives the notebook's
ranks theirs, ends the whole job when a rank raises (a rank left waiting in a
collective would hang the others until the time limit), runs ``!cmd`` lines, and
keeps matplotlib off any display.
"""

import atexit
import os
import subprocess
import sys
import traceback

os.environ.setdefault("MPLBACKEND", "Agg")  # a batch job has no display: figures are not shown

from mpi4py import MPI  # noqa: E402  (after MPLBACKEND)

from clusterkernel.torchdist._gpu import prepare_rank  # noqa: E402

RANK = MPI.COMM_WORLD.Get_rank()


class _RankLines:
    """Every line this rank writes starts with [rank N], as in the notebook."""

    def __init__(self, stream):
        self._stream, self._part = stream, ""

    def write(self, text):
        lines = (self._part + text).split("\n")
        self._part = lines.pop()
        if lines:
            self._stream.write("".join(f"[rank {RANK}] {line}\n" for line in lines))
            self._stream.flush()  # whole lines, at once: mpiexec interleaves ranks by line
        return len(text)

    def end_line(self):
        if self._part:
            self.write("\n")

    def __getattr__(self, name):
        return getattr(self._stream, name)


_OUT, _ERR = sys.stdout, sys.stderr = _RankLines(sys.stdout), _RankLines(sys.stderr)
atexit.register(lambda: (_OUT.end_line(), _ERR.end_line()))


def _abort(kind, value, tb):
    _OUT.end_line()
    _ERR.write("".join(traceback.format_exception(kind, value, tb)))
    _ERR.end_line()
    MPI.COMM_WORLD.Abort(1)  # end the job: the other ranks would wait for this one forever


sys.excepthook = _abort

# what every notebook rank gets at start: torchrun's environment (torch.distributed's
# init_process_group() finds it), and its GPU by LOCAL_RANK where the host has GPUs
prepare_rank()


def _system(cmd):
    """``!cmd`` of the notebook: a shell command, its output labelled like the rest."""
    done = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)


def display(*objs, **kwargs):
    """The notebook's display(): text here."""
    print(*objs)
