"""The slow-rank report: who contributes fresh or stale data, who initiates
rounds, how long each rank waits per post, and which rank holds the others
back. Built from the engine's per-stream statistics (identical on every rank,
since every rank takes every round) and the status every rank sends to every
other (its own waits and compute time per post).

Example::

    report = hvd.stats()["grads"]
    print(report["holding_back"], report["holding_back_reason"], report["rounds_per_second"])
"""

from __future__ import annotations

import statistics

#: A rank holds the others back when it computes this much longer per post
#: than the median of the others (and at least 1 ms longer).
SLOW_FACTOR = 1.25


def holding_back(compute_means: list, lags: list | None = None) -> tuple[int | None, str]:
    """The rank that holds the others back, and why; ``(None, reason)`` when
    the load looks balanced or there is too little data.

    ``compute_means[j]`` is rank j's mean time between the end of one post and
    the next (its computation), ``None`` if unknown. In sync mode the slow
    rank waits least; in solo mode it posts least often; in both it computes
    longest, which is what this looks at.

    Example::

        holding_back([0.02, 0.021, 0.12, 0.019])  # (2, 'computes 0.120 s per post ...')
    """
    known = [(j, c) for j, c in enumerate(compute_means) if c is not None]
    if len(known) < 2:
        return None, "not enough data yet"
    slowest, worst = max(known, key=lambda jc: jc[1])
    others = statistics.median(c for j, c in known if j != slowest)
    if worst > SLOW_FACTOR * others and worst - others > 1e-3:
        reason = f"computes {worst:.3f} s per post, the others {others:.3f} s (median)"
        if lags and slowest < len(lags) and lags[slowest]:
            reason += f"; {lags[slowest]} rounds behind at the latest round start"
        return slowest, reason
    return None, f"balanced (slowest rank {slowest}: {worst:.3f} s per post, median of the others {others:.3f} s)"


def enrich(snapshot: dict, statuses: dict, world_size: int, elapsed: float) -> dict:
    """Add per-rank figures from ``statuses`` (rank -> RankStatus) to the
    per-stream ``snapshot`` of :class:`~hvd_partial.engine.stats.StatsRecorder`.

    Adds to each stream: ``posts_by_rank``, ``wait_mean_s_by_rank``,
    ``wait_p95_s_by_rank``, ``compute_mean_s_by_rank`` (``None`` for a rank
    not heard from yet), ``holding_back`` (a rank or ``None``),
    ``holding_back_reason``, ``rounds_per_second`` (since ``init``) and
    ``elapsed_s``.
    """
    for name, stream in snapshot.items():
        posts, means, p95s, computes = ([None] * world_size for _ in range(4))
        for rank, status in statuses.items():
            figures = status.streams.get(name)
            if figures is None or rank >= world_size:
                continue
            posts[rank], means[rank], p95s[rank], computes[rank] = figures
        rank, reason = holding_back(computes, stream.get("lag"))
        stream.update(posts_by_rank=posts, wait_mean_s_by_rank=means, wait_p95_s_by_rank=p95s,
                      compute_mean_s_by_rank=computes, holding_back=rank, holding_back_reason=reason,
                      rounds_per_second=stream["rounds"] / elapsed if elapsed > 0 else 0.0, elapsed_s=elapsed)
    return snapshot


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_report(snapshot: dict, rates: dict | None = None, stalled: dict | None = None) -> str:
    """The report as text, one table per stream (what rank 0 logs at INFO).

    ``rates`` maps a stream to its recent rounds per second; ``stalled`` maps
    ranks to how long they have stalled.
    """
    lines = []
    for name, s in sorted(snapshot.items()):
        rate = (rates or {}).get(name, s.get("rounds_per_second", 0.0))
        back = s.get("holding_back")
        who = f"rank {back} ({s.get('holding_back_reason')})" if back is not None else "none"
        lines.append(f"stream {name!r}: {s['rounds']} rounds, {rate:.1f} rounds/s, max staleness seen "
                     f"{s['max_staleness_seen']}; holding others back: {who}")
        lines.append("  rank   posts   fresh   stale  initiated  lag  wait_mean_s  wait_p95_s  compute_s")
        for j in range(len(s["fresh"])):
            lines.append("  {:>4} {:>7} {:>7} {:>7} {:>10} {:>4} {:>12} {:>11} {:>10}".format(
                j, _fmt(s.get("posts_by_rank", [None] * (j + 1))[j], "d"), s["fresh"][j], s["stale"][j],
                s["initiated"][j], s["lag"][j] if j < len(s["lag"]) else "-",
                _fmt(s.get("wait_mean_s_by_rank", [None] * (j + 1))[j], ".4f"),
                _fmt(s.get("wait_p95_s_by_rank", [None] * (j + 1))[j], ".4f"),
                _fmt(s.get("compute_mean_s_by_rank", [None] * (j + 1))[j], ".4f")))
    for rank, seconds in sorted((stalled or {}).items()):
        lines.append(f"rank {rank} has stalled for {seconds:.1f} s")
    return "\n".join(lines) if lines else "no streams yet"
