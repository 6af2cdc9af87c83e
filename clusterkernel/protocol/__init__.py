"""What both sides know: the notebook (:mod:`clusterkernel.client`) and the ranks.

Every module here imports the standard library only, so either side loads it alone
(``tests/test_seam.py`` checks it loads neither side's machinery):

- ``records``: the kinds and fields of a metric record, made on a rank, drawn in
  the notebook;
- ``_wire``: the signed stream format the ranks' records travel in;
- ``_names``: the control-channel request and reply names, the stack signal, the
  ``breakpoint()`` key and the engine's pre-import variable;
- ``_targets``: every rank-side function the notebook calls, by name: the
  client-to-rank API in one list;
- ``_engine``: what the rank-side libraries ask of the engine (the world a respawn
  merges, the user namespace, the in-cell recovery), registered by ``rank/``, so they
  never import it;
- ``_rank_call``: the notebook calls a rank-side function by name, so it never
  imports the rank side;
- ``_shm_names``: the job's /dev/shm files, noted on the ranks, removed by the guard;
- ``_oom``: a memory cgroup's OOM-kill counter, noted on the rank, read in the notebook;
- ``_net``: which local address reaches a host;
- ``_errors``: :class:`ClusterkernelError`, the base of every error of either side;
- ``_calls``: the collective calls' names: the check's codes, the hang report's sizes;
- ``_ipykernel``: every touch of ipykernel's internals (control handlers, replies, the
  running request, completion), for the rank's handlers and the notebook's kernel
  alike; it works on the kernel object it is given and imports no more than the rest.
"""
