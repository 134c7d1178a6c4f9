"""Transports: the engine's seam (:mod:`.protocol`), MPI for real runs (:mod:`.mpi`)."""
