"""The engine's shutdown on a one-rank fake transport: it must not stop while
its last control messages are still queued in MPI (only MPI calls move them,
and peers wait for them), and it must not wait for them forever."""

import logging
import threading

from hvd_partial.config import Config
from hvd_partial.engine.engine import Engine


class _QueuedSends:
    """One rank whose sends stay queued for ``polls`` calls of
    ``progress_sends`` once armed, or forever with ``polls=None``."""

    rank, size, local_rank, local_size, doorbell, quorum_counters, helpers, tag_base = 0, 1, 0, 1, None, None, None, 0

    def __init__(self, polls):
        self.polls = polls
        self.armed = False
        self.calls_armed = 0
        self.last_outstanding = None
        self.lock = threading.Lock()

    def receive(self, rung=False):
        return []

    def progress_sends(self):
        with self.lock:
            if not self.armed:
                return 0
            self.calls_armed += 1
            queued = self.polls is None or self.calls_armed <= self.polls
            self.last_outstanding = 1 if queued else 0
            return self.last_outstanding

    def retain_unfinished_sends(self):  # pragma: no cover - only after a failure
        pass


def _shut_down(transport, **config):
    engine = Engine(transport, Config(**config))
    engine.start()
    transport.armed = True
    done = threading.Event()
    thread = threading.Thread(target=lambda: (engine.shutdown(), done.set()), daemon=True)
    thread.start()
    assert done.wait(20), "shutdown hung"
    return engine


def test_shutdown_waits_until_the_last_sends_have_left():
    transport = _QueuedSends(polls=50)
    engine = _shut_down(transport)
    assert engine.failure is None
    # it kept calling MPI until the queue was empty, and stopped only then
    assert transport.calls_armed > 50
    assert transport.last_outstanding == 0


def test_shutdown_gives_up_on_sends_that_never_leave_and_says_so(caplog):
    transport = _QueuedSends(polls=None)
    with caplog.at_level(logging.WARNING, logger="hvd_partial.engine"):
        engine = _shut_down(transport, failure_timeout_seconds=0.3)
    assert engine.failure is None
    assert transport.last_outstanding == 1
    assert any("rank 0: 1 control messages still unsent" in r.getMessage() for r in caplog.records)
