"""Drain throughput and memory on a simulated workload: `oml-lake simulate` writes a seeded
workload (every op, with injected bad input) into a fresh database; then `oml-lake drain
--until-idle` drains it into a fresh local lake, as its own process, once per batch cap given.
For each run: ops/s, the dead letters (they must be exactly the injected bad ops), the peak RSS
of the drain process, and its RSS sampled over time.

    .venv/bin/python bench/drain_bench.py --tenants 20 --claims 8300 --max-batch 50000
    .venv/bin/python bench/drain_bench.py --tenants 10 --claims 2000 --max-batch 1000 5000 50000 \\
        --plot bench/plots/rate_vs_batch.png

`--baseline-source DIR [DIR ...]` drains the same workload again with the code of each checkout
(`git archive <commit> | tar -x -C DIR`) for a same-run comparison. Every drain starts from the
database as the workload left it (a template copy): nothing sequenced, no verdicts.

`--writer-role` drains this checkout's code as a deployment's writer login role (row-level
security on, ADR 0049) instead of the DSN's own user; `--repeats N` runs every (cap, code) N
times, interleaved. The cost of row-level security, beside the code before it:

    git archive <commit before RLS> | tar -x -C /tmp/pre-rls
    .venv/bin/python bench/drain_bench.py --tenants 20 --claims 1500 --max-batch 500 50000 \
        --writer-role --repeats 3 --baseline-source /tmp/pre-rls
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import psycopg

from oml_dagster.simulate.runner import RunConfig, run
from oml_dagster.simulate.workload import WorkloadConfig

try:
    from bench._support import Snapshot, child_env, code_root, fresh_database, machine
except ImportError:  # run as a script
    from _support import Snapshot, child_env, code_root, fresh_database, machine


def _memory_mib(pid: int) -> tuple[float, float]:
    """The child's resident memory now and its peak since the memory governor last reset the
    peak reading (before each batch), in MiB; zeros once it is gone."""
    found = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    found[line[:5]] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return found.get("VmRSS", 0.0), found.get("VmHWM", 0.0)


# RSS is kept every quarter second (the plot); the peak is read every 20 ms from the kernel's
# high-water mark, which also holds the spikes between two readings (a batch's commit can rise
# and fall ~100 MiB within 0.25 s: bench/memory_phases.py).
PLOT_EVERY_S = 0.25
PEAK_EVERY_S = 0.02


def drain_once(
    snapshot: Snapshot,
    dsn: str,
    max_batch: int,
    source: str | None = None,
    drain_dsn: str | None = None,
) -> dict:
    """Drain everything into a fresh lake in a child process, from the database as the workload
    left it (nothing sequenced, no verdicts). With `source` (a checkout of an earlier commit)
    the child runs that code: a baseline from the same run, on the same workload. With
    `drain_dsn` the child connects with that DSN (a writer role's) instead of `dsn`."""
    snapshot.restore()
    with psycopg.connect(dsn, autocommit=True) as conn:
        ops = conn.execute("SELECT count(*) FROM oml.outbox").fetchone()[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = code_root(source)
        env = child_env(
            root, OML_PG_DSN=drain_dsn or dsn, OML_LAKE_URI=os.path.join(tmp, "oml-lake")
        )
        cmd = [sys.executable, "-m", "oml_dagster.cli", "drain", "--until-idle"]
        cmd += ["--max-batch", str(max_batch)]
        samples: list[tuple[float, float]] = []
        peak = [0.0]
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL)

        def sample() -> None:
            kept = 0.0
            while proc.poll() is None:
                now = time.perf_counter() - started
                rss, hwm = _memory_mib(proc.pid)
                peak[0] = max(peak[0], rss, hwm)
                if now >= kept:
                    samples.append((now, rss))
                    kept = now + PLOT_EVERY_S
                time.sleep(PEAK_EVERY_S)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = proc.wait()
        elapsed = time.perf_counter() - started
        sampler.join()
        if rc != 0:
            raise SystemExit(f"drain exited {rc}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        refused = conn.execute("SELECT count(*) FROM oml.lake_dead_letter").fetchone()[0]
        injected = conn.execute(
            "SELECT count(*) FROM oml.outbox WHERE payload ? 'sim_fault'"
        ).fetchone()[0]
    return {
        "max_batch": max_batch,
        "source": (source or "this checkout") + (" as the writer role" if drain_dsn else ""),
        "code": root,
        "ops": ops,
        "seconds": round(elapsed, 2),
        "ops_per_s": round(ops / elapsed),
        "dead_letters": refused,
        "injected_faults": injected,
        "peak_rss_mib": round(peak[0]),
        "rss": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--max-batch", type=int, nargs="+", default=[50_000])
    parser.add_argument("--bad-ratio", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plot", help="PNG: rate vs batch cap (several caps) or RSS over time")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--baseline-source",
        nargs="+",
        default=[],
        help="checkouts of earlier commits: each drain runs again with each one's code (baseline)",
    )
    parser.add_argument(
        "--writer-role",
        action="store_true",
        help="this checkout drains as a writer login role (row-level security on, ADR 0049)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each (cap, code)")
    args = parser.parse_args()

    with fresh_database() as dsn:
        started = time.perf_counter()
        workload = WorkloadConfig(args.tenants, args.claims, args.seed, args.bad_ratio)
        run(dsn, workload, RunConfig(writers=2))
        written = time.perf_counter() - started
        drain_dsn = writer_dsn(dsn) if args.writer_role else None
        snapshot = Snapshot(dsn)
        results = []
        try:
            for cap in args.max_batch:
                for _ in range(args.repeats):
                    results.append(drain_once(snapshot, dsn, cap, drain_dsn=drain_dsn))
                    for source in args.baseline_source:
                        results.append(drain_once(snapshot, dsn, cap, source))
        finally:
            snapshot.drop()

    print(machine())
    print(
        f"workload: {args.tenants} tenants x {args.claims} claims = {results[0]['ops']:,} outbox "
        f"rows (simulate, seed {args.seed}, bad ratio {args.bad_ratio}), written in {written:.1f}s"
    )
    for r in results:
        print(
            f"drain max-batch {r['max_batch']:>6}: {r['seconds']:7.1f} s, {r['ops_per_s']:>7,} ops/s,"
            f" {r['dead_letters']} dead letters ({r['injected_faults']} injected faults),"
            f" peak RSS {r['peak_rss_mib']} MiB ({r['source']}: {r['code']})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "results": results}, f)
    if args.plot:
        plot(results, args.plot)


WRITER_ROLE = "oml_bench_writer"


def writer_dsn(dsn: str) -> str:
    """`dsn` as the writer login role `oml-lake db upgrade --writer-role` makes (created here)."""
    from oml_dagster.lake import db

    with psycopg.connect(dsn, autocommit=True) as conn:
        db.create_writer_role(conn, WRITER_ROLE)
    return db.dsn_as(dsn, WRITER_ROLE)


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if len({r["max_batch"] for r in results}) > 1:
        results = [r for r in results if r["source"] == "this checkout"]
        ax.plot([r["max_batch"] for r in results], [r["ops_per_s"] for r in results], "o-")
        ax.set_xscale("log")
        ax.set_xlabel("batch cap (ops)")
        ax.set_ylabel("drain rate (ops/s)")
        ax.set_title(f"drain rate vs batch cap, {results[0]['ops']:,} simulated ops")
    else:
        for r in results:
            ax.plot([t for t, _ in r["rss"]], [m for _, m in r["rss"]], label=r["source"])
        ax.set_xlabel("seconds since the drain started")
        ax.set_ylabel("RSS (MiB)")
        r = results[0]
        ax.set_title(f"drain RSS, {r['ops']:,} ops, batch cap {r['max_batch']:,}")
        if len(results) > 1:
            ax.legend()
    ax.grid(True, alpha=0.3)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
