"""The notebook's name of each cell's code on this rank: ``Cell In[7]`` (rank side).

ipykernel compiles each cell to a file named after a hash of its text
(``/tmp/ipykernel_<pid>/<hash>.py``), and the engine counts its cells itself, so
neither says which notebook cell a function came from. The notebook sends its own
``In [N]`` in each cell's label (``protocol.records.cell_label``); an IPython
``pre_run_cell`` hook, armed when the engine starts, keeps a map from the file the
cell's code will have to that name, for every cell the rank runs (a helper defined
three cells before the profiled one is named after its own cell). The sampler
(``_profile_sampler.py``) names frames with :func:`cell_name`.

A cell sent without a number (``cluster.run`` from a script) is ``%%mpi cell``, as
tracebacks name it; the same text sent twice is named after its latest cell, as
IPython does.

Example::

    follow()                       # on an engine, once (``_engine_setup``)
    cell_name(code.co_filename)    # "Cell In[7]", or None for a file that is no cell
"""

from __future__ import annotations

import sys
from typing import Any

from clusterkernel.protocol import _ipykernel
from clusterkernel.protocol.records import UNNUMBERED_CELL, label_count

MAX_CELLS = 10_000
"""Cell files remembered (the oldest go first): a script sending cells in a loop."""

_names: dict[str, str] = {}
_followed: set[int] = set()  # id() of the shells whose hook is registered


def cell_name(filename: str) -> str | None:
    """The notebook's name of the cell compiled to ``filename``, or None when no cell
    this rank ran has that file.

    Example::

        cell_name("/tmp/ipykernel_4242/3855724513.py")   # "Cell In[7]"
    """
    return _names.get(filename)


def note(filename: str, count: int | None) -> None:
    """Remember that ``filename`` holds the notebook's cell ``count`` (None: unnumbered).

    Example::

        note("/tmp/ipykernel_4242/3855724513.py", 7)
    """
    _names.pop(filename, None)  # re-inserted last: the newest is dropped last
    _names[filename] = UNNUMBERED_CELL if count is None else f"Cell In[{count}]"
    while len(_names) > MAX_CELLS:
        del _names[next(iter(_names))]


def follow(shell: Any = None) -> bool:
    """Name every cell this engine runs from now on (an IPython ``pre_run_cell`` hook);
    False where no kernel runs (an exported job: its frames name the script's lines).

    Example::

        follow()   # True on an engine
    """
    if shell is None:
        ipython = sys.modules.get("IPython")  # loaded on every engine; never imported here
        shell = ipython.get_ipython() if ipython is not None else None
    kernel = _ipykernel.kernel_of(shell)
    if kernel is None:
        return False
    if id(shell) in _followed:
        return True
    _followed.add(id(shell))

    def before(info: Any = None) -> None:
        raw = getattr(info, "raw_cell", None)
        if not isinstance(raw, str):
            return
        try:
            label = (_ipykernel.running_request(kernel).get("metadata") or {}).get("label")
            # the file IPython is about to compile this cell to (ipykernel: a hash of its text)
            filename = shell.compile.get_code_name(raw, raw, shell.execution_count)
        except Exception:  # an unusual shell: its frames keep their file names
            return
        note(filename, label_count(label))

    shell.events.register("pre_run_cell", before)
    return True
