"""Where a drain's batches reach their peak memory: `oml-lake simulate` writes a seeded workload
into a fresh database, then a child process drains it (`oml-lake drain --until-idle`) with a
thread reading its resident memory every 5 ms, each reading tagged with the stage the main
thread is in (the sequencer's cut, a batch's read, its fold, each table's commit, the rest of
the commit phase, the release of freed memory). For each batch: its lowest and highest
reading and the stage of the highest, then how many batches peaked in each stage.

    .venv/bin/python bench/memory_phases.py --tenants 1 --claims 160000     # 1M ops, one tenant

The fetch of the next batch runs on its own thread: its memory counts in the stage the main
thread is in meanwhile. The sampler costs the drain a few per cent: time drains with
`drain_bench.py`.
"""

from __future__ import annotations

# First: importing oml_dagster sets delta-rs's allocator up, as in the product (ADR 0041).
import oml_dagster  # noqa: F401

# isort: split
import argparse
import collections
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

try:
    from bench._support import child_env, code_root, fresh_database, machine
except ImportError:  # run as a script
    from _support import child_env, code_root, fresh_database, machine


def _tagged_drain(max_batch: int) -> dict:
    """Drain in this process with every stage tagged; the readings per batch. The stages are a
    tenant batch's phases (`TenantBatch.read`, `fold`, `commit`), each table's commit (heard by
    a `CommitObserver`), the sequencer's cut and the release of freed memory."""
    from oml_dagster import cli
    from oml_dagster.lake.ingest import sequencer
    from oml_dagster.lake.write import drain
    from oml_dagster.lake.write.commit import CommitObserver, TableCommit
    from oml_dagster.lake.write.memory import resident_mib
    from oml_dagster.lake.write.writer import TenantBatch

    stage, batch = ["drain loop"], [0]
    readings: list[tuple[float, float, str, int]] = []
    done = threading.Event()

    def sample() -> None:
        started = time.perf_counter()
        while not done.is_set():
            readings.append((time.perf_counter() - started, resident_mib(), stage[0], batch[0]))
            time.sleep(0.005)

    @contextlib.contextmanager
    def staged(label: str):
        before, stage[0] = stage[0], label
        try:
            yield
        finally:
            stage[0] = before

    def tag(module, name: str, label: str) -> None:
        inner = getattr(module, name)

        def tagged(*args, **kwargs):
            with staged(label):
                return inner(*args, **kwargs)

        setattr(module, name, tagged)

    class Commits(CommitObserver):
        def before(self, commit: TableCommit) -> None:
            stage[0] = f"commit {commit.table.spec_name}"

        def landed(self, commit: TableCommit) -> None:
            stage[0] = "verdicts, frontier, compact"

    class Tagged(TenantBatch):
        def __init__(self, **options):
            super().__init__(**{**options, "commits": Commits()})

        def read(self, conn, **options):
            batch[0] += 1
            with staged("read"):
                return super().read(conn, **options)

        def fold(self, read):
            with staged("fold"):
                return super().fold(read)

        def commit(self, conn, read, folded):
            with staged("verdicts, frontier, compact"):
                return super().commit(conn, read, folded)

    drain.TenantBatch = Tagged
    tag(sequencer, "sequence_for_batches", "sequencer")
    tag(drain, "release_memory", "release")

    threading.Thread(target=sample, daemon=True).start()
    with contextlib.redirect_stdout(io.StringIO()):
        cli.main(["drain", "--until-idle", "--max-batch", str(max_batch)])
    done.set()
    return {"readings": readings}


def _report(readings: list) -> str:
    per_batch = collections.defaultdict(list)
    for reading in readings:
        per_batch[reading[3]].append(reading)
    peaked: collections.Counter[str] = collections.Counter()
    highest: dict[str, float] = collections.defaultdict(float)
    lines = ["batch  at s  lowest MiB  peak MiB  stage at the peak"]
    for number, batch in sorted(per_batch.items()):
        at, peak, stage, _ = max(batch, key=lambda r: r[1])
        lowest = min(r[1] for r in batch)
        peaked[stage] += 1
        lines.append(f"{number:5d} {at:6.1f} {lowest:10.0f} {peak:9.0f}  {stage}")
    for _, rss, stage, _ in readings:
        highest[stage] = max(highest[stage], rss)
    lines.append(
        "batches peaking in each stage: " + ", ".join(f"{s} {n}" for s, n in peaked.most_common())
    )
    by_height = sorted(highest.items(), key=lambda kv: -kv[1])
    lines.append(
        "highest reading in each stage (MiB): " + ", ".join(f"{s} {v:.0f}" for s, v in by_height)
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=1)
    parser.add_argument("--claims", type=int, default=20000)
    parser.add_argument("--max-batch", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write every reading here")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the drain's process: its output file
    args = parser.parse_args()
    if args.child:
        with open(args.child, "w") as out:
            json.dump(_tagged_drain(args.max_batch), out)
        return

    from oml_dagster.simulate.runner import RunConfig, run
    from oml_dagster.simulate.workload import WorkloadConfig

    with fresh_database() as dsn, tempfile.TemporaryDirectory() as tmp:
        run(dsn, WorkloadConfig(args.tenants, args.claims, args.seed, 0.01), RunConfig(writers=2))
        print(machine())
        root = code_root(None)
        env = child_env(root, OML_PG_DSN=dsn, OML_LAKE_URI=os.path.join(tmp, "oml-lake"))
        out = os.path.join(tmp, "readings.json")
        child = [sys.executable, os.path.abspath(__file__), "--child", out]
        child += ["--max-batch", str(args.max_batch)]
        started = time.perf_counter()
        subprocess.run(child, cwd=root, env=env, check=True)
        elapsed = time.perf_counter() - started
        with open(out) as f:
            readings = json.load(f)["readings"]
    print(f"workload: {args.tenants} tenants x {args.claims} claims; drained in {elapsed:.1f} s")
    print(_report(readings))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(readings, f)


if __name__ == "__main__":
    main()
