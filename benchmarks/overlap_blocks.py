"""The block loop and the table of the overlap benchmarks (``overlap_backward.py``
for PyTorch, ``overlap_backward_tf.py`` for Keras): every method in each block,
in an order rotated from block to block, each under a fresh
``init(overlap_backward=method != "off")``; a block's figures are the slowest
rank's tuple of medians (seconds, the step first).

Example::

    per_block = run_blocks(hvd, ["on", "off"], 5, 4 << 20, lambda method: block(method, args))
    print_medians(per_block, ["on", "off"], ["step ms", "backward ms", "step() ms"])
"""

from __future__ import annotations

import statistics


def run_blocks(hvd, methods: list[str], blocks: int, threshold: int, measure) -> list[dict]:
    """``measure(method)`` on every rank, per block and method; rank 0 prints each block's step times."""
    per_block: list[dict] = []
    for b in range(blocks):
        order = methods[b % len(methods):] + methods[:b % len(methods)]
        figures = {}
        for method in order:
            hvd.init(fusion_threshold_bytes=threshold, overlap_backward=(method != "off"))
            figures[method] = max(hvd.allgather_object(measure(method)))  # the slowest rank's medians
            rank = hvd.rank()
            hvd.shutdown()
        per_block.append(figures)
        if rank == 0:
            print(f"block {b}: " + "  ".join(f"{m} {figures[m][0] * 1e3:.1f} ms" for m in methods), flush=True)
    return per_block


def print_medians(per_block: list[dict], methods: list[str], columns: list[str]) -> None:
    """Each method's medians over the blocks (ms), and its paired step ratio to ``off``."""
    print("method  " + "".join(f"{c:>{max(len(c), 8) + 2}s}" for c in columns) + "  paired step ratio to off")
    for m in methods:
        med = [statistics.median(f[m][i] for f in per_block) * 1e3 for i in range(len(columns))]
        ratio = statistics.median(f[m][0] / f["off"][0] for f in per_block) if "off" in methods else float("nan")
        print(f"{m:8s}" + "".join(f"{v:{max(len(c), 8) + 2}.1f}" for v, c in zip(med, columns)) + f" {ratio:12.3f}")
