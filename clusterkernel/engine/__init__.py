"""The engine side's own set-up: code that runs inside each rank's ipyparallel engine.

``_engine_setup`` gives a rank its identity and the control-channel handlers
(stacks, debug requests), ``_debugger`` is ``breakpoint()`` and post-mortem on a
rank, and ``_job_prelude`` is the file an exported batch job runs first. The
client reaches these only through the seam (``records``, ``_wire``) and the
control channel, never by calling into them in the notebook process.
"""
