"""PNG plots from one `bench/run_all.sh` or `bench/run_lag.sh` results folder: drain rate vs
batch cap, RSS over the drain with the largest cap, retract time vs silver table size, lag and
backlog over time under a paced stream (one line per config).

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


def memory_plot(results: dict, out: str) -> None:
    """RSS over one tenant's drain (issue 10 target 3), each code of the run, with the bound."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results["results"]:
        label = f"{r['source']}: peak {r['peak_rss_mib']:,} MiB, {r['ops_per_s']:,} ops/s"
        ax.plot([t for t, _ in r["rss"]], [m for _, m in r["rss"]], label=label)
    ax.axhline(1024, color="grey", linestyle="--", linewidth=1, label="1 GiB")
    ax.set_xlabel("seconds since the drain started")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title(f"one tenant's drain, {results['results'][0]['ops']:,} ops")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    _save(fig, out, "drain1_rss.png")


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


def lag_plot(results: dict, out: str) -> None:
    """Lag (age of the oldest outbox row not drained) and backlog over time, one line per
    config; a dotted line where each config's stream ended."""
    fig, (lag_ax, backlog_ax) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for r in results["results"]:
        c = r["config"]
        label = f"{c['name']}: {c['rate']:g} ops/s, {c['tenants']} tenants"
        t = [s["t"] for s in r["samples"]]
        (line,) = lag_ax.plot(t, [s["lag_s"] for s in r["samples"]], label=label)
        backlog_ax.plot(t, [s["backlog_ops"] for s in r["samples"]], color=line.get_color())
        for ax in (lag_ax, backlog_ax):
            end = r.get("first_op_s", 0.0) + r["stream_s"]
            ax.axvline(end, color=line.get_color(), linestyle=":", linewidth=1)
        if c.get("p95_target_s"):
            lag_ax.axhline(c["p95_target_s"], color=line.get_color(), linestyle="--", linewidth=1)
    lag_ax.set_ylabel("lag (s)")
    lag_ax.set_title("lag under a paced stream (dotted: stream end; dashed: p95 target)")
    lag_ax.legend(fontsize=8)
    backlog_ax.set_ylabel("ops not drained")
    backlog_ax.set_xlabel("seconds since the producer started")
    for ax in (lag_ax, backlog_ax):
        ax.grid(True, alpha=0.3)
    _save(fig, out, "lag_over_time.png")


def main() -> None:
    folder, out = sys.argv[1], sys.argv[2]
    for name, draw in (
        ("drain.json", drain_plots),
        ("memory.json", memory_plot),
        ("retract.json", retract_plot),
        ("lag.json", lag_plot),
    ):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            with open(path) as f:
                draw(json.load(f), out)


if __name__ == "__main__":
    main()
