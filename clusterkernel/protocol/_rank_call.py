"""Call a rank-side function by name from the notebook (shared by both sides).

The notebook must not import rank-side modules (they may import torch or mpi4py),
yet ipyparallel's ``apply`` sends functions by reference. :func:`rank_call` is the
reference it sends: it lives in a module with no imports beyond the standard
library, and imports the named function only on the rank.

Example::

    view.apply_sync(rank_call, TORCH_DESCRIBE)   # a name from protocol._targets
"""

from __future__ import annotations

import importlib
from typing import Any


def rank_call(target: str, *args: Any, **kwargs: Any) -> Any:
    """Import ``"package.module:function"`` (a :mod:`~clusterkernel.protocol._targets`
    name) here, on the rank, and call it."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(*args, **kwargs)
