"""PNG plots from one `bench/run_all.sh` results folder: drain rate vs batch cap, RSS over the
drain with the largest cap, retract time vs silver table size.

    .venv/bin/python bench/plots.py bench/results/<stamp> bench/plots
"""

from __future__ import annotations

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _save(fig, out: str, name: str) -> None:
    os.makedirs(out, exist_ok=True)
    fig.tight_layout()
    path = os.path.join(out, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")


def drain_plots(results: dict, out: str) -> None:
    runs = sorted(results["results"], key=lambda r: r["max_batch"])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["max_batch"] for r in runs], [r["ops_per_s"] for r in runs], "o-")
    ax.set_xscale("log")
    ax.set_xlabel("batch cap (ops)")
    ax.set_ylabel("drain rate (ops/s)")
    ax.set_title(f"drain rate vs batch cap, {runs[0]['ops']:,} simulated ops")
    ax.grid(True, alpha=0.3)
    _save(fig, out, "rate_vs_batch.png")

    r = runs[-1]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([t for t, _ in r["rss"]], [m for _, m in r["rss"]])
    ax.set_xlabel("seconds since the drain started")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title(f"drain RSS, {r['ops']:,} ops, batch cap {r['max_batch']:,}")
    ax.grid(True, alpha=0.3)
    _save(fig, out, "drain_rss.png")


def retract_plot(results: dict, out: str) -> None:
    rows = [r["rows"] for r in results["results"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(
        rows, [r["drain_median_s"] * 1000 for r in results["results"]], "o-", label="drain batch"
    )
    ax.plot(rows, [r["merge_median_ms"] for r in results["results"]], "s-", label="MERGE alone")
    ax.set_xscale("log")
    ax.set_xlabel("silver.claims rows (Z-ordered)")
    ax.set_ylabel("median time per 10-claim retract (ms)")
    ax.set_title("retract time vs table size")
    ax.legend()
    ax.grid(True, alpha=0.3)
    _save(fig, out, "retract_vs_size.png")


def main() -> None:
    folder, out = sys.argv[1], sys.argv[2]
    for name, draw in (("drain.json", drain_plots), ("retract.json", retract_plot)):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            with open(path) as f:
                draw(json.load(f), out)


if __name__ == "__main__":
    main()
