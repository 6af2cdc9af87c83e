"""The engine side's own set-up: code that runs inside each rank's ipyparallel engine.

``_engine_setup`` gives a rank its identity and the control-channel handlers
(stacks, debug requests), ``_debugger`` is ``breakpoint()`` and post-mortem on a
rank, ``_completion`` answers Tab and Shift-Tab from the rank's namespace,
``_warnings`` names cells in warnings, and ``_job_prelude`` is the file an exported
batch job runs first. The notebook process imports these modules only for what it
sends to the ranks: ``_engine_setup.setup`` (applied on each rank at start) and the
names of the control-channel requests; it never runs their code itself.
"""
