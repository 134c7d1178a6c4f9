"""Exception classes raised by hvd_partial.

Every error the library raises derives from :class:`HvdPartialError`, so a
training script can catch them all at once::

    try:
        hvd.partial_allreduce(grad, "grads")
    except hvd.RankFailedError as err:
        print("rank", err.rank, "failed")
"""

from __future__ import annotations


class HvdPartialError(RuntimeError):
    """Base class of every error raised by hvd_partial."""


class NotInitializedError(HvdPartialError):
    """A call was made before ``init()`` or after ``shutdown()``."""


class ConfigError(HvdPartialError, ValueError):
    """A configuration value (argument or environment variable) is invalid."""


class UnsupportedInputError(HvdPartialError, TypeError):
    """An array has a dtype, layout or device the library does not handle."""


class StreamConflictError(HvdPartialError):
    """A stream name was reused on this rank with another shape, dtype, mode or op,
    or a stream already has a post that was not synchronized."""


class MismatchError(HvdPartialError):
    """Ranks disagree about a stream (shape, dtype, mode, op or staleness bound).

    Raised on every rank; the message names the ranks and what differs.
    """


class RankFailedError(HvdPartialError):
    """Another rank raised, died or stopped answering.

    ``rank`` is the rank that failed (or ``None`` when it is unknown) and
    ``reason`` says what was observed.
    """

    def __init__(self, rank: int | None, reason: str):
        self.rank = rank
        self.reason = reason
        who = f"rank {rank}" if rank is not None else "a remote rank"
        super().__init__(f"{who} failed: {reason}")


class MpiUnavailableError(HvdPartialError, ImportError):
    """``init()`` could not import mpi4py (or its MPI library).

    The rest of the package (the protocol core, the simulator) works without
    MPI; ``init()`` and everything after it need it.
    """


class TooManyStreamsError(HvdPartialError):
    """MPI could not create a new stream's communicator, or a session has
    more majority streams with a quorum than their counters' window holds.

    Every stream holds an MPI communicator of its own, and an MPI library
    allows only so many at once (MPICH about 2,000); majority streams with a
    quorum keep their counters in one window made at ``init``, room for 256.
    Reduce many arrays as one stream with ``grouped_partial_allreduce_async``.
    A full quorum window refuses only the first post of the new stream (on
    every rank, as each makes that post); the engine and its other streams go
    on. Where MPI runs out of communicators the engine stops: later calls
    raise this error too.
    """


class EngineError(HvdPartialError):
    """The background engine hit an internal error; the message says which."""


class DuplicateNameError(StreamConflictError, ValueError):
    """A helper collective was submitted under a name that already has a
    request in flight on this rank (Horovod refuses that too). Raised on that
    rank only, at the call."""


class NotSupportedError(HvdPartialError, NotImplementedError):
    """A Horovod feature hvd_partial does not provide (Adasum, a process set made
    from an MPI communicator, ...); the message says what to use instead."""


class ProcessSetError(HvdPartialError, ValueError):
    """A process set was misused: a rank outside the set called a collective
    on it, a set with the ranks of another (or of the global set) was added,
    ranks out of range, or a set that was removed, never added, or dropped
    when the elastic world changed was passed. The message names the rank
    and the set. A ``ValueError``, as Horovod raises for these."""


class UlfmUnavailableError(NotSupportedError):
    """The MPI library, or the way the job was launched, gives no fault
    tolerance (ULFM): a dead rank cannot be survived. The message says which
    and how to launch instead (Open MPI 5 with ``mpirun --with-ft ulfm --mca
    btl tcp,self``)."""


class RecoveryError(HvdPartialError):
    """The survivors of a failure could not rebuild a communicator (shrink
    or grow); the message says which step failed and what MPI said."""


class HorovodInternalError(HvdPartialError):
    """A helper collective (``allreduce``, ``broadcast``, ``barrier``, ...)
    could not complete because the world changed (a rank died and the
    survivors shrank the job; elastic training only). Every survivor gets it
    from the same call: the one in flight at the change, or else its first
    helper call after it, until the rank acknowledges the change
    (:func:`hvd_partial.acknowledge_world_change`, which ``hvd.elastic.run``'s
    reset does). Horovod's name, so ``except hvd.HorovodInternalError`` works."""


class HostsUpdatedInterrupt(HvdPartialError):
    """The world changed (ranks lost or added) while training went on;
    ``state.commit()`` and ``state.check_host_updates()`` raise it so that
    ``hvd.elastic.run`` runs the reset callbacks. ``skip_sync``: the state
    need not be broadcast again (the survivors are consistent)."""

    def __init__(self, skip_sync: bool = False, message: str = "the world changed"):
        self.skip_sync = skip_sync
        super().__init__(message)


class RankDrained(SystemExit):
    """Elastic training with ``hvd-partial-run --host-discovery-script``: this rank's host
    is no longer listed (or lists fewer slots), so the rank left the world cleanly at this
    ``state.commit()``: every round it took part in is summed on the others, its session is
    shut down. Raised by ``state.commit()`` on the rank that leaves; ``hvd.elastic.run`` lets
    it through, and uncaught it ends the program with status 0, without ``MPI_Finalize``
    (which would wait for the job's end). A ``SystemExit``, so ``except Exception`` does not
    catch it (docs/elastic.md, "Hosts from a discovery script")."""

    def __init__(self, message: str):
        super().__init__(0)
        self.message = message

    def __str__(self) -> str:
        return self.message


class PartialResultError(HvdPartialError):
    """Elastic training, internal: a reduction or helper collective completed on
    this rank without every rank's part (Open MPI's nonblocking collectives can,
    once a peer died). It counts as not completed here, and the survivors'
    recovery decides its outcome; callers never see this error."""
