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
"""
