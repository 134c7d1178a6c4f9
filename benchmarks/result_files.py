"""Where the benchmark scripts put their results.

``benchmarks/results/`` holds the published (tracked) results. A new run
writes to ``benchmarks/results/new/`` (ignored by git) unless it is given an
explicit path, so running a benchmark never overwrites a published file.

Example::

    out = args.out or new_result_path("soak.json")
"""

from __future__ import annotations

import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
#: Default destination of new runs; its own .gitignore keeps it out of git.
NEW_RESULTS = os.path.join(RESULTS, "new")


def new_result_path(filename: str) -> str:
    """``results/new/<filename>``, creating the folder (and its .gitignore).

    Example::

        p.add_argument("--out", default=None)
        out = args.out or new_result_path("soak.json")
    """
    os.makedirs(NEW_RESULTS, exist_ok=True)
    ignore = os.path.join(NEW_RESULTS, ".gitignore")
    if not os.path.exists(ignore):
        with open(ignore, "w") as fh:
            fh.write("*\n")
    return os.path.join(NEW_RESULTS, filename)


def save_figure(fig, name: str) -> str:
    """Write a matplotlib figure to ``results/new/<name>``, close it, return the path.

    Example::

        made.append(save_figure(fig, "paper_scale_projection.png"))
    """
    import matplotlib.pyplot as plt

    path = new_result_path(name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
