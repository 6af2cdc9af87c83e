"""The notebook side: everything here runs in the notebook, IPython or the MPI kernel.

Nothing here runs on a rank, and nothing here imports mpi4py or a module of the rank
side (``clusterkernel.rank``, ``comm``, ``metrics``, ...): rank-side functions are
named (:mod:`clusterkernel.protocol._rank_call`), and so are the requests a rank
answers (:mod:`clusterkernel.protocol._names`). The public names are
``clusterkernel``'s own (``from clusterkernel import Cluster, Dashboard``):

- ``cluster/``: :class:`~clusterkernel.Cluster`, launching, one running cell
  (``runner``), the reports on failing and hung ranks;
- ``debug/``: pdb on ranks from the notebook (``DebugSession``), the prompt at a
  rank's ``breakpoint()`` (``_breakpoints``) and the ``%mpi debug`` loop (``_prompt``);
- ``magics/`` (``%mpi``, ``%%mpi``), ``output/`` (per-rank renderers), ``dashboard/``,
  ``export/`` (a notebook as a batch job), ``kernel`` (the MPI kernel), ``mpiexec``,
  ``errors``, ``quickstart``, ``teaching_notebooks``.
"""
