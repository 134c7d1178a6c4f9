"""Transports: MPI for real runs, an in-process loopback for tests."""
