"""The engine's reductions with a scripted transport (no MPI): a solo or
majority round's facts are reduced before its data, and their completion
alone tells that every rank joined the round."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from hvd_partial.core.rank_stream import Launch
from hvd_partial.engine.reductions import Reductions


class Request:
    def __init__(self, buffer):
        self.buffer = buffer
        self.complete = False


class ScriptedTransport:
    """Every started reduction is a request the test completes by hand."""

    def __init__(self):
        self.started: list[Request] = []

    def new_stream_comm(self):
        return object(), None

    @staticmethod
    def stream_comm_ready(request) -> bool:
        return True

    def iallreduce_in_place(self, comm, buffer):
        self.started.append(Request(buffer))
        return self.started[-1]

    @staticmethod
    def done(requests) -> bool:
        return all(r.complete for r in requests)


def reductions_with_a_stream():
    transport = ScriptedTransport()
    completed = []
    reductions = Reductions(transport, 0, 0.0, lambda stream, launch, reduced: completed.append(launch.round))
    stream = SimpleNamespace(id=0, name="grads")
    reductions.add_stream(stream)
    while reductions.progress():  # the stream's communicator
        pass
    return transport, reductions, stream, completed


def test_facts_go_first_and_their_completion_tells_everyone_joined():
    transport, reductions, stream, completed = reductions_with_a_stream()
    data = [np.ones(8, np.float32), np.ones(3, np.float32)]
    facts = np.zeros((4, 2), np.int64)
    reductions.launch(stream, Launch(5, [*data, facts], None, with_facts=True, owned=[True, True, True]))
    assert [r.buffer is facts for r in transport.started] == [True, False, False]
    assert not reductions.everyone_joined(0, 5)
    transport.started[0].complete = True  # the facts: every rank started them
    assert reductions.everyone_joined(0, 5)
    assert not reductions.everyone_joined(0, 6) and not reductions.everyone_joined(1, 5)
    reductions.progress()
    assert completed == []  # the data is still in flight
    for request in transport.started:
        request.complete = True
    reductions.progress()
    assert completed == [5]
    assert not reductions.everyone_joined(0, 5)  # completed: nothing is held for it any more


def test_a_round_without_facts_never_tells_it():
    transport, reductions, stream, _ = reductions_with_a_stream()
    reductions.launch(stream, Launch(0, [np.ones(4, np.float32)], None, owned=[True]))
    transport.started[0].complete = True
    assert not reductions.everyone_joined(0, 0)


def test_an_early_joiner_stops_napping_once_the_facts_complete():
    transport, reductions, stream, _ = reductions_with_a_stream()
    reductions.launch(stream, Launch(2, [np.ones(4, np.float32), np.zeros((4, 2), np.int64)], None,
                                     with_facts=True, owned=[True, True]))
    awaiting = lambda sid, r: (sid, r) == (0, 2)  # noqa: E731 - joined round 2 before hearing it start
    assert reductions.only_awaiting_start(awaiting)
    transport.started[0].complete = True  # everyone joined: the data needs this rank in MPI
    assert not reductions.only_awaiting_start(awaiting)
