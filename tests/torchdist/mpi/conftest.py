"""Rank-side cases: each runs on every rank of one ``mpiexec`` job (see ../test_on_mpiexec.py)."""
