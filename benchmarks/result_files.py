"""Where the benchmark scripts put their plots: ``benchmarks/results/``."""

from __future__ import annotations

import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def save_figure(fig, name: str) -> str:
    """Write a matplotlib figure to ``results/<name>``, close it, return the path.

    Example::

        made.append(save_figure(fig, "paper_scale_projection.png"))
    """
    import matplotlib.pyplot as plt

    path = os.path.join(RESULTS, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
