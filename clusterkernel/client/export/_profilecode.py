"""The lines an exported job gets from ``export --profile``: every rank profiled, one file per viewer.

Every rank samples its Python stacks from the top of the job to its end with the
notebook's own sampler (``clusterkernel.rank._profile``, as ``%%mpi --profile``; no
ipyparallel, no notebook). At the end, rank 0 gathers the ranks' samples over MPI
and writes what the notebook's ``profile.save`` writes, with the same writer
(``clusterkernel.client.profile._export``): ``<stem>.speedscope.json`` (speedscope:
one profile per rank) and ``<stem>.trace.json`` (Perfetto or chrome://tracing: one
process per rank, every rank on one clock), beside the script; ``<stem>-<job id>``
under Slurm or Grid Engine, as the job's ``.out``. A rank that raises ends the job
before anyone can gather: it writes its own samples first (``<stem>.rank<N>.*``).

Example::

    profile_block("python")   # the job's lines, after the prelude (and torch's block)
"""

from __future__ import annotations

from clusterkernel.client.export._cellcode import ExportError
from clusterkernel.client.profile._kinds import PROFILE_KINDS, ProfileKind

# The block's lines; {torch} is filled in. Its atexit hook is registered after the
# prelude's and torch's, so it runs before them (atexit is last in, first out): the
# ranks gather while MPI and torch's groups are still up.
_BLOCK = """\
# Profiled (export --profile{flag}): every rank samples its Python stacks from here to
# the end, as %%mpi --profile does. At the end rank 0 writes, beside this script,
# <stem>.speedscope.json (https://www.speedscope.app: a profile per rank) and
# <stem>.trace.json (https://ui.perfetto.dev: a process per rank), <stem>-<job id>
# under Slurm or Grid Engine; a rank that raises writes its own (<stem>.rank<N>.*).
from clusterkernel.rank import _profile as _ck_profile  # noqa: E402

_PROFILE_STEM = os.path.splitext(os.path.abspath(__file__))[0] + "".join(
    f"-{{j}}" for j in [os.environ.get("SLURM_JOB_ID") or os.environ.get("JOB_ID")] if j
)


def _profile_write(ranks, stem):
    # the notebook's writer (json only: no IPython, no ipyparallel)
    from clusterkernel.client.profile._export import save_files

    print("profile:", ", ".join(map(str, save_files(ranks, stem))))


def _profile_end():
    ranks = _ck_profile.gather(MPI.COMM_WORLD)  # every rank's samples, on rank 0
    if ranks is not None:
        _profile_write(ranks, _PROFILE_STEM)


def _profile_then_abort(kind, value, tb, _abort=sys.excepthook):
    # the job ends with this rank: the others' samples are lost, this rank's are kept
    try:
        data = _ck_profile.stop()
        if data is not None:
            _profile_write({{RANK: data}}, f"{{_PROFILE_STEM}}.rank{{RANK}}")
    finally:
        _abort(kind, value, tb)


sys.excepthook = _profile_then_abort
atexit.register(_profile_end)
_ck_profile.start(torch={torch})"""


def profile_block(kind: ProfileKind) -> str:
    """The exported job's lines that profile every rank (``kind``: ``"python"`` or
    ``"torch"``, ``--profile``'s value). Raises :class:`ExportError` for another kind.

    Example::

        script_parts.append(profile_block("python"))
    """
    if kind not in PROFILE_KINDS:
        raise ExportError(
            f"--profile takes {' or '.join(PROFILE_KINDS)} (or nothing: python), got {kind!r}"
        )
    torch = kind == "torch"
    return _BLOCK.format(flag=" torch" if torch else "", torch=torch)
