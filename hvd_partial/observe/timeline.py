"""Chrome-trace timeline of one rank (open in chrome://tracing or Perfetto).

Each rank writes its own file (``pid`` = rank), streamed as it runs, so that
a crashed job still leaves a readable trace: the file is a JSON array that is
closed at shutdown (Chrome and Perfetto also read it unclosed). Merge the
ranks' files into one with ``python -m hvd_partial timeline-merge OUT.json``
(``hvd-partial-run --timeline-filename`` does it when the job ends).

Events, per rank:

- thread ``compute``: ``post`` (instant, when a post is submitted) and
  ``wait`` (span from the submission to the moment its rounds are handed
  over; ``flush`` for a flush), with the stream, and the rounds taken;
- thread ``engine``: ``activation`` (span from this rank's request of a
  round until the round starts here, or an instant when other ranks started
  it), ``reduction`` (span of the round's reduction, with round number,
  initiator, contributors and the largest staleness) and ``take`` (instant:
  rounds handed to the caller).

Example::

    HVD_PARTIAL_TIMELINE_FILENAME=/tmp/tl.json mpiexec -n 4 python train.py
    python -m hvd_partial timeline-merge /tmp/tl.json   # reads /tmp/tl.rank*.json
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import time
from collections import deque

log = logging.getLogger("hvd_partial.timeline")

COMPUTE_TID = 1
ENGINE_TID = 2
_FLUSH_EVERY_EVENTS = 2000
_FLUSH_EVERY_SECONDS = 1.0


def _j(value) -> str:
    """A JSON scalar: int, bool or None."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(int(value))


def rank_path(filename: str, rank: int) -> str:
    """The file rank ``rank`` writes: ``{rank}`` replaced, or ``.rank<N>`` put
    before the suffix (``t.json`` -> ``t.rank3.json``).

    Example::

        rank_path("/tmp/tl.json", 2)  # '/tmp/tl.rank2.json'
    """
    if "{rank}" in filename:
        return filename.replace("{rank}", str(rank))
    stem, suffix = os.path.splitext(filename)
    return f"{stem}.rank{rank}{suffix or '.json'}"


class Timeline:
    """Writes the trace events of one rank; only the engine thread calls it.

    Example::

        tl = Timeline("/tmp/tl.json", rank=0, size=2)
        tl.post("grads", time.perf_counter())
        tl.close()
    """

    def __init__(self, filename: str, rank: int, size: int):
        self.path = rank_path(filename, rank)
        self.rank = rank
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        self._file = open(self.path, "w", buffering=1 << 16)
        # perf_counter -> microseconds since the epoch: one clock for every rank on a node.
        self._offset_us = (time.time() - time.perf_counter()) * 1e6
        self._pending: list[str] = []
        self._names: dict[str, str] = {}  # stream -> its JSON string
        self._first = True
        self._next_flush = time.perf_counter() + _FLUSH_EVERY_SECONDS
        self._requested: dict[str, float] = {}  # stream -> when this rank's waiting post was handled
        self._launched: dict[str, deque] = {}  # stream -> launch times of rounds in flight
        self._closed = False
        self._file.write("[\n")
        self._meta("process_name", {"name": f"rank {rank}"})
        self._meta("process_sort_index", {"sort_index": rank})
        self._meta("thread_name", {"name": "compute"}, COMPUTE_TID)
        self._meta("thread_name", {"name": "engine"}, ENGINE_TID)
        log.debug("rank %d writes its timeline to %s", rank, self.path)

    # -- event writers ----------------------------------------------------------
    # Events are formatted by hand (no json.dumps per event): this runs on the
    # engine thread for every round, so it must stay a few microseconds.

    def _ts(self, perf: float) -> float:
        return perf * 1e6 + self._offset_us

    def _quoted(self, stream: str) -> str:
        quoted = self._names.get(stream)
        if quoted is None:
            quoted = self._names[stream] = json.dumps(stream)
        return quoted

    def _emit(self, text: str) -> None:
        self._pending.append(text)
        if len(self._pending) >= _FLUSH_EVERY_EVENTS:
            self.flush()

    def _meta(self, name: str, args: dict, tid: int = 0) -> None:
        self._emit(json.dumps({"name": name, "ph": "M", "pid": self.rank, "tid": tid, "args": args},
                              separators=(",", ":")))

    def _instant(self, name: str, cat: str, perf: float, tid: int, args: str) -> None:
        self._emit(f'{{"name":"{name}","cat":{cat},"ph":"i","s":"t","ts":{self._ts(perf):.1f},'
                   f'"pid":{self.rank},"tid":{tid},"args":{args}}}')

    def _span(self, name: str, cat: str, begin: float, end: float, tid: int, args: str) -> None:
        dur = (end - begin) * 1e6 if end > begin else 0.0
        self._emit(f'{{"name":"{name}","cat":{cat},"ph":"X","ts":{self._ts(begin):.1f},"dur":{dur:.1f},'
                   f'"pid":{self.rank},"tid":{tid},"args":{args}}}')

    # -- engine hooks -------------------------------------------------------------

    def post(self, stream: str, posted_at: float) -> None:
        """A post of ``stream`` was submitted at ``posted_at`` (perf_counter)."""
        cat = self._quoted(stream)
        self._instant("post", cat, posted_at, COMPUTE_TID, f'{{"stream":{cat}}}')
        self._requested[stream] = time.perf_counter()

    def launched(self, stream: str, launch) -> None:
        """A round of ``stream`` starts on this rank (engine ``_launch``)."""
        now = time.perf_counter()
        facts = launch.facts
        cat = self._quoted(stream)
        args = f'{{"stream":{cat},"round":{_j(launch.round)},"initiator":{_j(facts.initiator if facts else None)}}}'
        requested = self._requested.pop(stream, None)
        if requested is not None:
            self._span("activation", cat, requested, now, ENGINE_TID, args)
        else:
            self._instant("activation", cat, now, ENGINE_TID, args)
        self._launched.setdefault(stream, deque()).append(now)

    def reduced(self, stream: str, launch, result) -> None:
        """The oldest round in flight of ``stream`` completed with ``result`` (engine ``_complete``)."""
        now = time.perf_counter()
        queue = self._launched.get(stream)
        begin = queue.popleft() if queue else now
        facts = launch.facts
        cat = self._quoted(stream)
        send = launch.send
        if send is not None and getattr(launch, "with_facts", False):
            send = send[:-1]  # the last buffer carries the round's facts, not data
        nbytes = sum(b.nbytes for b in send) if send is not None else 0
        if facts is not None or launch.with_facts:  # (a decentralized round has no Start, only its facts)
            contributors = "[" + ",".join(map(str, result.contributors)) + "]"
            stale = max(result.staleness.values(), default=0)
            args = (f'{{"stream":{cat},"round":{_j(launch.round)},"initiator":{_j(result.initiator)},'
                    f'"contributors":{contributors},"max_staleness":{stale},"flush":{_j(result.flush)},'
                    f'"bytes":{nbytes}}}')
        else:
            args = (f'{{"stream":{cat},"round":{_j(launch.round)},"initiator":null,"contributors":"all",'
                    f'"max_staleness":0,"flush":false,"bytes":{nbytes}}}')
        self._span("reduction", cat, begin, now, ENGINE_TID, args)

    def finished(self, stream: str, kind: str, handle, rounds: list[int]) -> None:
        """A post or flush of ``stream`` completed with ``rounds`` taken."""
        end = handle.finished_at or time.perf_counter()
        self._requested.pop(stream, None)
        cat = self._quoted(stream)
        args = f'{{"stream":{cat},"rounds":[{",".join(map(str, rounds))}]}}'
        self._instant("take", cat, end, ENGINE_TID, args)
        self._span("wait" if kind == "post" else "flush", cat, handle.posted_at, end, COMPUTE_TID, args)

    def tick(self, now: float) -> None:
        if now >= self._next_flush:
            self._next_flush = now + _FLUSH_EVERY_SECONDS
            self.flush()

    def flush(self) -> None:
        if self._closed or not self._pending:
            return
        text = ",\n".join(self._pending)
        self._pending.clear()
        self._file.write(text if self._first else ",\n" + text)
        self._first = False
        self._file.flush()

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._file.write("\n]\n")
        self._file.close()


# ===== reading and merging =====================================================

def load_events(path: str) -> list[dict]:
    """The events of a timeline file, also of one left unclosed by a crash.

    Example::

        events = load_events("/tmp/tl.rank0.json")
    """
    with open(path) as fh:
        text = fh.read().strip()
    if not text:
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = json.loads(text.rstrip(",\n ") + "\n]")
    return data["traceEvents"] if isinstance(data, dict) else data


def rank_files(filename: str) -> list[str]:
    """The per-rank files that ``filename`` stands for, in rank order."""
    if "{rank}" in filename:
        pattern = filename.replace("{rank}", "*")
        regex = re.escape(filename).replace(re.escape("{rank}"), r"(\d+)")
    else:
        stem, suffix = os.path.splitext(filename)
        suffix = suffix or ".json"
        pattern = f"{glob.escape(stem)}.rank*{glob.escape(suffix)}"
        regex = re.escape(stem) + r"\.rank(\d+)" + re.escape(suffix)
    found = []
    for path in glob.glob(pattern):
        match = re.fullmatch(regex, path)
        if match:
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def merge(filename: str, out: str | None = None) -> tuple[str, int, int]:
    """Merge the per-rank files of ``filename`` into one trace (``out``, by
    default ``filename`` itself, or ``timeline.json`` beside the rank files
    when the name holds ``{rank}``). Returns (path, files, events).

    Example::

        merge("/tmp/tl.json")  # /tmp/tl.rank0.json, ... -> /tmp/tl.json
    """
    files = rank_files(filename)
    if not files:
        raise FileNotFoundError(f"no per-rank timeline files found for {filename!r} "
                                f"(looked for {rank_path(filename, 0)} and the other ranks)")
    if out is None:
        out = filename if "{rank}" not in filename else os.path.join(os.path.dirname(filename) or ".",
                                                                     "timeline.json")
    events = []
    for path in files:
        events.extend(load_events(path))
    with open(out, "w") as fh:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, fh, separators=(",", ":"))
    return out, len(files), len(events)
