"""The case files under mpi/ run inside mpiexec (see test_comm_mpi.py), not here."""

collect_ignore = ["mpi"]
