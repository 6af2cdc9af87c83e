"""The engine's own runtime: code that runs inside each rank's ipyparallel engine.

``_engine_setup`` gives a rank its identity and the control-channel handlers
(stacks, completion, torch aborts, the GPU), ``_debugger`` is ``breakpoint()`` and
post-mortem on a rank (with ``_frames``, the locals it shows: the debugger's rank
half), ``_completion`` answers Tab and Shift-Tab from the rank's namespace,
``_warnings`` names cells in warnings, ``_warm_start`` starts the engine beside its
imports, and ``_job_prelude`` is the file an exported batch job runs first. The
notebook never imports these modules: it calls ``_engine_setup.setup`` by name
(:mod:`clusterkernel.protocol._rank_call`) and sends the requests named in
:mod:`clusterkernel.protocol._names`.

The rank-side libraries below (``comm``, ``torchdist``, ``train``, ...) never import
this package either: what they ask of the engine is in
:mod:`clusterkernel.protocol._engine`, where ``_world.replace`` sets the world a
respawn merges and the in-cell recovery (``_recovery``) is registered here, at the
first import of any rank module (the notebook's calls import one before a cell can
need it).
"""

from clusterkernel.protocol._engine import register_recovery
from clusterkernel.rank import _recovery

register_recovery(_recovery)
