"""Where a drain's time goes: `oml-lake simulate` writes a seeded workload into a fresh database,
then `oml-lake drain --until-idle` drains it under py-spy (sampling every thread, idle waits
included), and the main thread's samples are summed per function: inclusive (the function and
what it called) and self (the function alone; `Connection.wait` and ADBC's `execute` are time
spent waiting on PostgreSQL).

    .venv/bin/python bench/drain_profile.py --tenants 20 --claims 8300        # 1M ops
    .venv/bin/python bench/drain_profile.py --tenants 20 --claims 2000 --raw out.raw

Needs py-spy (`pip install -e ".[bench]"`). The drain runs slower under the sampler than alone:
read the shares, not the seconds, and time drains with `drain_bench.py`.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

from oml_dagster.simulate.runner import RunConfig, run
from oml_dagster.simulate.workload import WorkloadConfig

try:
    from bench._support import child_env, code_root, fresh_database, machine
except ImportError:  # run as a script
    from _support import child_env, code_root, fresh_database, machine

# A frame's file, shortened: the path inside site-packages, or from oml_dagster/ on.
_SITE = re.compile(r"\(/\S*?/site-packages/")
_OURS = re.compile(r"\(/\S*?/(oml_dagster/)")


def summarize(raw_path: str, thread: str = "MainThread", top: int = 40) -> str:
    """The samples of `thread` in py-spy's raw (collapsed stacks) output, per function."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    with open(raw_path) as f:
        for line in f:
            stack, count = line.rsplit(" ", 1)
            frames = stack.split(";")
            if thread not in frames[0]:
                continue
            n = int(count)
            total += n
            frames = [_OURS.sub(r"(\1", _SITE.sub("(", fr)) for fr in frames[1:]]
            for frame in set(frames):
                inclusive[frame] += n
            if frames:
                own[frames[-1]] += n
    lines = [f"{thread}: {total} samples"]
    for title, counter in (("inclusive", inclusive), ("self", own)):
        lines.append(f"--- {title}")
        lines += [f"{n:6d} {100 * n / total:5.1f}%  {fr}" for fr, n in counter.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--max-batch", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=int, default=20, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--raw", help="keep py-spy's raw output here")
    args = parser.parse_args()

    with fresh_database() as dsn, tempfile.TemporaryDirectory() as tmp:
        run(dsn, WorkloadConfig(args.tenants, args.claims, args.seed, 0.01), RunConfig(writers=2))
        raw = args.raw or os.path.join(tmp, "drain.raw")
        root = code_root(None)  # this checkout's code, wherever the profile is run from
        env = child_env(root, OML_PG_DSN=dsn, OML_LAKE_URI=os.path.join(tmp, "oml-lake"))
        drain = [sys.executable, "-m", "oml_dagster.cli", "drain", "--until-idle"]
        drain += ["--max-batch", str(args.max_batch)]
        beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
        spy = [
            beside if os.path.exists(beside) else "py-spy",
            "record",
            "--idle",
            "--threads",
            "--rate",
            str(args.rate),
        ]
        spy += ["--format", "raw", "--output", raw, "--"]
        subprocess.run(spy + drain, cwd=root, env=env, check=True, stdout=subprocess.DEVNULL)
        print(machine())
        print(f"workload: {args.tenants} tenants x {args.claims} claims, seed {args.seed}")
        print(summarize(raw, top=args.top))


if __name__ == "__main__":
    main()
