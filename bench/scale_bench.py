"""Cores buy tenants (issue 43, target 2): shard runs as run containers under a CPU quota.

The compose stack as CI runs it (deploy/docker/compose.yaml + compose.ci.yaml: host networking,
every server on 127.0.0.1, moto for the object store), with compose.scale.yaml on top: the shard
count (OML_DRAIN_SHARDS = k) and every run container's CPU quota (OML_RUN_NANO_CPUS, the
DockerRunLauncher's `nano_cpus` through the code location's container context, ADR 0069) per
config. PostgreSQL, moto, the daemon, the code server and the producer have no quota.

For each config `KxQ` (K shard containers of Q core each) and tenant count T:
  1. a fresh stack (volumes dropped): only the services a drain needs (PostgreSQL, moto, the
     migrations, the code server, the daemon), no webserver, exporter or Prometheus;
  2. wait until the K standing shard runs have started (Dagster's run storage) and their
     containers carry the quota (`HostConfig.NanoCpus`), then let them idle a few seconds;
  3. `oml-lake simulate --rate R --duration D` over T tenants, in a container of the image on
     the host's network (no quota), as deploy/soak.py streams;
  4. every `--interval` s: the lag as bench/lag_bench.py defines it (the age of the oldest outbox
     op not yet drained into the core tables, unsequenced or beyond its tenant's drained
     frontier, over all tenants: its `_SAMPLE`), and the tenant batches committed so far;
  5. after the stream, sample on until the backlog is gone (the drain time) or `--drain-cap`.

Figures per config: tenant batches per second over the steady part of the stream (from the
end of the first pass, when every tenant has had its first batch, which creates its tables, and
at least `--warmup` s after the first op, to the stream's end; when the first pass outlasts the
stream, from the warm-up, flagged), its ratio to the 1x0.25 config's, p50/p95
lag over the stream (from its first op, as lag_bench), the drain time, and the CPU the shard
containers used over the steady window from their cgroups (`cpuacct.usage` / `cpu.stat`), with
the share of CFS periods throttled: that they used their quota and no more shows the quota held
and the drain was CPU-bound.

A tenant batch is one batch of one tenant committed by the writer; every batch appends to the
tenant's bronze.events (each act journals an event), so the count is the sum over tenants of
bronze.events' Delta version + 1 as the frontier cache records it after each batch
(`oml.lake_frontier.table_version`), read each sample. The writers' own counter of committed
batches (`oml.lake_writer_counters`, batch_seconds_count) is reported beside it after the drain
as a cross-check: flushed at a pass's end, at most every 15 s, it trails by up to a pass.

    python3 bench/scale_bench.py --quick                  # 1x0.25 and 2x0.25, 100 tenants, 60 s
    python3 bench/scale_bench.py --json scale.json        # the matrix: 4 configs x 100, 1000

Needs psycopg (the project's venv: `.venv/bin/python bench/scale_bench.py`), Docker and
docker-compose set up as deploy/smoke.sh does; the images are built as deploy/smoke.py builds
them (`--no-build` skips that). Exits non-zero when a config could not be measured (the stack
did not come up, the standing runs did not start, the stream failed), not on a missed target.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OML_SMOKE_PROJECT", "oml-scale")

HERE = Path(__file__).resolve().parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
REPO = HERE.parent
sys.path.insert(0, str(REPO / "deploy"))
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
import smoke  # noqa: E402
from lag_bench import _SAMPLE, _age, _pct  # noqa: E402
from smoke import SmokeFailed, run  # noqa: E402

SHARD_JOB = "lake_writer_shard_job"
# Only what a drain needs: compose starts their dependencies (PostgreSQL, moto, the migrations,
# the bucket).
SERVICES = ("code", "daemon")
NANO = 1_000_000_000
# The shortest steady window (seconds) worth a rate: shorter, the warm-up's window is used.
MIN_WINDOW = 20.0

BATCHES = """
SELECT coalesce(sum(table_version + 1), 0), count(*) FROM oml.lake_frontier
WHERE table_name = 'bronze.events' AND table_version IS NOT NULL
"""
COUNTER_BATCHES = (
    "SELECT coalesce(sum(value), 0) FROM oml.lake_writer_counters"
    " WHERE name = 'batch_seconds_count'"
)
RUNS = "SELECT pipeline_name, status, count(*) FROM runs GROUP BY pipeline_name, status"


def say(message: str) -> None:
    print(f"scale: {message}", file=sys.stderr, flush=True)


def compose(*args: str, timeout: float = 900) -> str:
    files = [
        "-f", str(smoke.DOCKER / "compose.yaml"),
        "-f", str(smoke.DOCKER / "compose.ci.yaml"),
        "-f", str(smoke.DOCKER / "compose.scale.yaml"),
    ]  # fmt: skip
    return run("docker-compose", "-p", smoke.PROJECT, *files, *args, timeout=timeout)


def parse_config(text: str) -> tuple[int, float]:
    count, _, cores = text.partition("x")
    try:
        k, q = int(count), float(cores)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a config is KxQ, e.g. 2x0.25") from None
    if k < 1 or not 0 < q <= 64:
        raise argparse.ArgumentTypeError(f"{text!r}: K >= 1 containers of Q > 0 cores")
    return k, q


def dsn() -> str:
    return f"postgresql://oml:{os.environ['POSTGRES_PASSWORD']}@127.0.0.1:{smoke.PG_PORT}/oml"


# --- the run containers' CPU, from their cgroups ------------------------------------------------


def _cgroup_dirs(container_id: str, controller: str) -> list[Path]:
    """Where a container's cgroup of `controller` (cpu, cpuacct) may be: cgroup v1 (the
    controllers mounted apart or together; the cgroupfs or systemd driver), or v2."""
    root = Path("/sys/fs/cgroup")
    found = []
    for mount in (controller, "cpu,cpuacct"):
        found += [
            root / mount / "docker" / container_id,
            root / mount / "system.slice" / f"docker-{container_id}.scope",
        ]
    return found + [
        root / "system.slice" / f"docker-{container_id}.scope",
        root / "docker" / container_id,
    ]


def _first(paths: list[Path]) -> Path | None:
    return next((p for p in paths if p.exists()), None)


def container_cpu(container_id: str) -> dict | None:
    """CPU seconds used, CFS periods and throttled periods, and the CFS quota in cores of a
    running container (None when its cgroup is gone)."""
    try:
        usage = _first([d / "cpuacct.usage" for d in _cgroup_dirs(container_id, "cpuacct")])
        stat = _first([d / "cpu.stat" for d in _cgroup_dirs(container_id, "cpu")])
        if stat is None:
            return None
        fields = dict(line.split() for line in stat.read_text().splitlines() if line.strip())
        if usage is not None:  # v1
            used = int(usage.read_text()) / 1e9
            quota_us = int((stat.parent / "cpu.cfs_quota_us").read_text())
            period_us = int((stat.parent / "cpu.cfs_period_us").read_text())
        else:  # v2: usage in cpu.stat, the quota in cpu.max ("max 100000" without one)
            used = int(fields["usage_usec"]) / 1e6
            limit, period = (stat.parent / "cpu.max").read_text().split()
            quota_us, period_us = (-1 if limit == "max" else int(limit)), int(period)
    except (OSError, KeyError, ValueError):
        return None
    return {
        "cpu_s": used,
        "periods": int(fields.get("nr_periods", 0)),
        "throttled": int(fields.get("nr_throttled", 0)),
        "quota_cores": quota_us / period_us if quota_us > 0 else None,
    }


def shard_containers() -> dict[str, dict]:
    """The running shard-run containers: id -> run id and the CPU quota docker gave them."""
    ids = run(
        "docker", "ps", "-q", "--no-trunc", "--filter", f"label=dagster/job_name={SHARD_JOB}"
    ).split()
    found = {}
    for c in json.loads(run("docker", "inspect", *ids)) if ids else []:
        found[c["Id"]] = {
            "run_id": c["Config"]["Labels"].get("dagster/run_id"),
            "nano_cpus": c["HostConfig"].get("NanoCpus") or 0,
        }
    return found


def cpu_snapshot(ids) -> dict[str, dict]:
    return {i: s for i in ids if (s := container_cpu(i)) is not None}


def outside_containers(stream: str) -> dict[str, str]:
    """The containers outside the quotas (the stack's services and the stream): id -> name."""
    ids = run(
        "docker", "ps", "-q", "--no-trunc",
        "--filter", f"label=com.docker.compose.project={smoke.PROJECT}",
    ).split()  # fmt: skip
    ids += run("docker", "ps", "-q", "--no-trunc", "--filter", f"name=^{stream}$").split()
    found = {}
    for c in json.loads(run("docker", "inspect", *ids)) if ids else []:
        found[c["Id"]] = c["Config"]["Labels"].get("com.docker.compose.service") or "stream"
    return found


def host_busy() -> tuple[float, float]:
    """The host's CPU seconds (all CPUs) busy and in total since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    total = sum(fields[:8])  # user..steal (guest time is inside user)
    return (total - idle) / CLK_TCK, total / CLK_TCK


def outside_snapshot(names: dict[str, str]) -> tuple[dict[str, dict], tuple[float, float]]:
    return cpu_snapshot(names), host_busy()


def outside_between(first, last, names: dict[str, str], seconds: float) -> dict:
    """Cores each service outside the quotas used over a window, and the host's busy cores."""
    (c0, (busy0, _)), (c1, (busy1, _)) = first, last
    per: dict[str, float] = {}
    for i in sorted(set(c0) & set(c1)):
        name = names.get(i, "?")
        per[name] = per.get(name, 0.0) + (c1[i]["cpu_s"] - c0[i]["cpu_s"]) / seconds
    return {
        "cores_by_service": {n: round(v, 3) for n, v in sorted(per.items())},
        "cores": round(sum(per.values()), 3),
        "host_busy_cores": round((busy1 - busy0) / seconds, 3),
        "host_cores": os.cpu_count(),
    }


def cpu_between(first: dict[str, dict], last: dict[str, dict], seconds: float) -> dict:
    common = sorted(set(first) & set(last))
    used = sum(last[i]["cpu_s"] - first[i]["cpu_s"] for i in common)
    periods = sum(last[i]["periods"] - first[i]["periods"] for i in common)
    throttled = sum(last[i]["throttled"] - first[i]["throttled"] for i in common)
    return {
        "containers": len(common),
        "cpu_s": round(used, 1),
        "cores": round(used / seconds, 3) if seconds > 0 else None,
        "per_container_cores": [
            round((last[i]["cpu_s"] - first[i]["cpu_s"]) / seconds, 3) for i in common
        ]
        if seconds > 0
        else [],
        "throttled_share": round(throttled / periods, 3) if periods else None,
        # The quota the kernel enforces on each (CFS quota / period), as docker set it.
        "cgroup_quota_cores": sorted({last[i]["quota_cores"] for i in common}, key=str),
    }


# --- the stack ------------------------------------------------------------------------------


def teardown() -> None:
    compose("down", "-v", "--remove-orphans", "--timeout", "10", timeout=300)
    leftover = [c["id"] for c in smoke.run_containers(running=False)]
    if leftover:
        run("docker", "rm", "-f", *leftover, check=False)
    run("docker", "rm", "-f", f"{smoke.PROJECT}-stream", check=False)


def bring_up(k: int, q: float, run_seconds: int) -> float:
    """A fresh stack for k shards of q cores; seconds until the code server is healthy."""
    os.environ["OML_SCALE_SHARDS"] = str(k)
    os.environ["OML_RUN_NANO_CPUS"] = str(round(q * NANO))
    os.environ["OML_SCALE_RUN_SECONDS"] = str(run_seconds)
    teardown()
    started = time.monotonic()
    compose("up", "-d", *SERVICES, timeout=600)

    def up():
        code = smoke.health("code")
        daemon = json.loads(run("docker", "inspect", smoke.container("daemon")))[0]["State"]
        if code in ("unhealthy", "exited", "dead") or daemon["Status"] in ("exited", "dead"):
            logs = run("docker", "logs", "--tail", "20", smoke.container("code"), check=False)
            raise SmokeFailed(f"code {code}, daemon {daemon['Status']}:\n{logs}")
        return code == "healthy" and daemon["Running"]

    smoke.wait_for("the code server healthy and the daemon running", up, timeout=420)
    for one_shot in smoke.ONE_SHOT:
        state = json.loads(run("docker", "inspect", smoke.container(one_shot)))[0]["State"]
        if state["ExitCode"] != 0:
            raise SmokeFailed(f"{one_shot} exited {state['ExitCode']}")
    return time.monotonic() - started


def wait_standing(conn: psycopg.Connection, k: int, q: float, timeout: float) -> dict:
    """Every shard's standing run started (Dagster's run storage) in a container under quota."""
    started = time.monotonic()

    def ready():
        try:
            rows = conn.execute(
                "SELECT count(*) FROM runs WHERE pipeline_name = %s AND status = 'STARTED'",
                (SHARD_JOB,),
            ).fetchone()
        except psycopg.errors.UndefinedTable:
            conn.rollback()
            return None
        found = shard_containers()
        if rows[0] >= k and len(found) >= k:
            return found
        raise SmokeFailed(f"{rows[0]} shard runs started, {len(found)} containers")

    found = smoke.wait_for(f"{k} standing shard runs started", ready, timeout=timeout, interval=2)
    wrong = {i[:12]: c["nano_cpus"] for i, c in found.items() if c["nano_cpus"] != round(q * NANO)}
    if wrong:
        raise SmokeFailed(f"shard containers without the quota {round(q * NANO)}: {wrong}")
    return {"ready_s": round(time.monotonic() - started, 1), "containers": sorted(found)}


def stream_state(name: str) -> int | None:
    """The stream container's exit code, None while it runs."""
    out = run("docker", "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", name).split()
    return None if out[0] == "true" else int(out[1])


# --- one config -------------------------------------------------------------------------------


def measure(k: int, q: float, tenants: int, args: argparse.Namespace) -> dict:
    name = f"{k}x{q:g}"
    result: dict = {
        "config": name,
        "shards": k,
        "core_per_shard": q,
        "shard_cores": round(k * q, 3),
        "tenants": tenants,
        "rate_ops_s": args.rate,
        "stream_s": args.seconds,
    }
    began = time.monotonic()
    say(f"{name}, {tenants} tenants: a fresh stack")
    result["stack_up_s"] = round(bring_up(k, q, args.run_seconds), 1)
    with psycopg.connect(dsn(), autocommit=True) as conn:
        standing = wait_standing(conn, k, q, timeout=args.standing_timeout)
        result["standing_ready_s"] = standing["ready_s"]
        say(f"{k} standing shard runs up ({standing['ready_s']} s after the stack); idling")
        idle0 = cpu_snapshot(standing["containers"])
        time.sleep(args.idle)
        result["idle_cpu"] = cpu_between(idle0, cpu_snapshot(standing["containers"]), args.idle)

        stream = f"{smoke.PROJECT}-stream"
        run("docker", "rm", "-f", stream, check=False)
        # About 6.7 ops a claim: enough claims that the workload outlasts the stream.
        claims = max(2, -(-args.rate * args.seconds // (5 * tenants)) + 1)
        smoke.in_image(
            "oml-lake", "simulate", "--tenants", str(tenants), "--claims", str(claims),
            "--seed", str(args.seed), "--rate", str(args.rate), "--duration", str(args.seconds),
            "--no-progress", name=stream, detach=True, owner=True,
        )  # fmt: skip
        started = time.monotonic()
        say(f"streaming {args.rate} ops/s for {args.seconds} s over {tenants} tenants")
        samples: list[dict] = []
        stream_end = first_op = first_pass = gone_at = None
        window: dict = {}
        outside: dict = {}  # the same points for the containers outside the quotas, and the host
        outside_names = outside_containers(stream)
        while True:
            tick = time.monotonic()
            t = tick - started
            now, backlog, oldest_seq, unseq, oldest_unseq = conn.execute(_SAMPLE).fetchone()
            oldest = min((x for x in (oldest_seq, oldest_unseq) if x is not None), default=None)
            batches, tables = conn.execute(BATCHES).fetchone()
            sample = {
                "t": round(t, 2),
                "streaming": stream_end is None,
                "lag_s": round(_age(now, oldest), 2),
                "backlog_ops": backlog + unseq,
                "batches": int(batches),
                "tenants_drained": tables,
            }
            samples.append(sample)
            if first_op is None and sample["backlog_ops"] > 0:
                first_op = t
            if first_pass is None and tables >= tenants:
                first_pass = t
            if stream_end is None:
                warm = first_op is not None and t >= first_op + args.warmup
                if warm and "warm" not in window:
                    window["warm"] = (t, sample["batches"], cpu_snapshot(standing["containers"]))
                    outside["warm"] = outside_snapshot(outside_names)
                if warm and first_pass is not None and "steady" not in window:
                    window["steady"] = (t, sample["batches"], cpu_snapshot(standing["containers"]))
                    outside["steady"] = outside_snapshot(outside_names)
                code = stream_state(stream)
                if code is not None:
                    stream_end = t
                    result["backlog_at_stream_end"] = sample["backlog_ops"]
                    window["end"] = (t, sample["batches"], cpu_snapshot(standing["containers"]))
                    outside["end"] = outside_snapshot(outside_names)
                    logs = run("docker", "logs", stream, check=False)
                    result["producer_report"] = logs.strip().splitlines()[:2]
                    if code != 0:
                        raise SmokeFailed(f"the stream exited {code}:\n{logs[-2000:]}")
                    if "warm" not in window:
                        raise SmokeFailed("the stream ended before its warm-up did")
            elif sample["backlog_ops"] == 0:
                gone_at = t
                break
            elif t - stream_end > args.drain_cap:
                break
            if t > args.seconds + args.drain_cap + 300:
                raise SmokeFailed("the stream did not end in time")
            time.sleep(max(0.0, args.interval - (time.monotonic() - tick)))
        run("docker", "rm", "-f", stream, check=False)

        # The steady window opens once every tenant has had its first batch (which creates its
        # tables, a heavier commit than any later one), and at least --warmup s after the first
        # op; when the first pass outlasts the stream less MIN_WINDOW, the window opens at the
        # warm-up and the figure includes first batches (said in the result).
        steady = window.get("steady")
        steady_outside = outside.get("steady")
        if steady is None or window["end"][0] - steady[0] < MIN_WINDOW:
            steady, steady_outside = window["warm"], outside["warm"]
        (t0, b0, c0), (t1, b1, c1) = steady, window["end"]
        during = [s["lag_s"] for s in samples if s["streaming"] and s["t"] >= (first_op or 0)]
        steady_lags = [s["lag_s"] for s in samples if s["streaming"] and t0 <= s["t"] <= t1]
        result.update(
            {
                "first_op_s": round(first_op or 0.0, 1),
                # Seconds from the first op until every tenant had its first batch (None: not
                # within the measurement).
                "first_pass_s": round(first_pass - first_op, 1)
                if first_pass is not None and first_op is not None
                else None,
                "window_after_first_pass": steady is window.get("steady"),
                "window_s": round(t1 - t0, 1),
                "tenant_batches_in_window": b1 - b0,
                "tenant_batches_per_s": round((b1 - b0) / (t1 - t0), 2),
                "lag_p50_s": round(_pct(during, 0.50), 1),
                "lag_p95_s": round(_pct(during, 0.95), 1),
                "lag_max_s": round(max(during, default=0.0), 1),
                # The same over the steady window only (after the first pass, when it ended).
                "window_lag_p50_s": round(_pct(steady_lags, 0.50), 1),
                "window_lag_p95_s": round(_pct(steady_lags, 0.95), 1),
                "backlog_at_drain_end": samples[-1]["backlog_ops"],
                "drain_s": round(gone_at - stream_end, 1) if gone_at is not None else None,
                "drain_cap_s": args.drain_cap,
                "shard_cpu": cpu_between(c0, c1, t1 - t0),
                # What the rest of the stack used beside the shards, and the host in all: when
                # the host is busy on every core, the shards' unused quota is the host's bound.
                "outside_cpu": outside_between(
                    steady_outside, outside["end"], outside_names, t1 - t0
                ),
            }
        )
        cpu = result["shard_cpu"]
        result["quota_used"] = round(cpu["cores"] / (k * q), 3) if cpu["cores"] else None
        # The writers' own count, once every writer has flushed (every 15 s while polling).
        time.sleep(args.counter_wait)
        result["tenant_batches_total"] = int(conn.execute(BATCHES).fetchone()[0])
        result["writer_counter_batches"] = int(conn.execute(COUNTER_BATCHES).fetchone()[0])
        result["runs"] = [list(r) for r in conn.execute(RUNS).fetchall()]
        # Runs of other jobs (each a container under the same quota, outside the shard CPU
        # measured): none are expected.
        result["other_runs"] = sum(n for job, _, n in result["runs"] if job != SHARD_JOB)
        result["samples"] = samples
    result["elapsed_s"] = round(time.monotonic() - began, 1)
    say(
        f"{name}, {tenants} tenants: {result['tenant_batches_per_s']} tenant batches/s, lag p50 "
        f"{result['lag_p50_s']} s p95 {result['lag_p95_s']} s, drain {result['drain_s']} s, "
        f"shard CPU {cpu['cores']} cores ({result['quota_used']} of the quota, "
        f"throttled {cpu['throttled_share']}); outside the quotas "
        f"{result['outside_cpu']['cores_by_service']}, host busy "
        f"{result['outside_cpu']['host_busy_cores']} of {result['outside_cpu']['host_cores']} "
        f"cores; {result['elapsed_s']} s"
    )
    return result


# --- the report -------------------------------------------------------------------------------


def table(results: list[dict]) -> str:
    lines = []
    for tenants in sorted({r["tenants"] for r in results}):
        rows = [r for r in results if r["tenants"] == tenants]
        base = next((r for r in rows if r["config"] == "1x0.25"), None)
        lines.append(f"\n{tenants} tenants")
        lines.append(
            "| config | shard cores | tenant batches/s | vs 1x0.25 | lag p50 s | lag p95 s "
            "| window p95 s | drain s | shard CPU (cores) | of quota | throttled | first pass s "
            "| outside the quotas (cores) | host busy (cores) |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            if "failure" in r:
                lines.append(f"| {r['config']} | {r['shard_cores']:g} | failed: {r['failure']} |")
                continue
            ratio = (
                round(r["tenant_batches_per_s"] / base["tenant_batches_per_s"], 2)
                if base and base.get("tenant_batches_per_s")
                else None
            )
            drain = r["drain_s"] if r["drain_s"] is not None else f"> {r['drain_cap_s']:g}"
            cpu = r["shard_cpu"]
            outside = r.get("outside_cpu", {})
            first = r["first_pass_s"] if r["first_pass_s"] is not None else "-"
            # *: the window includes first batches (the first pass outlasted the stream).
            mark = "" if r["window_after_first_pass"] else "*"
            lines.append(
                f"| {r['config']} | {r['shard_cores']:g} | {r['tenant_batches_per_s']}{mark} "
                f"| {ratio if ratio is not None else '-'} | {r['lag_p50_s']} | {r['lag_p95_s']} "
                f"| {r['window_lag_p95_s']} "
                f"| {drain} | {cpu['cores']} | {r['quota_used']} | {cpu['throttled_share']} "
                f"| {first} | {outside.get('cores', '-')} "
                f"| {outside.get('host_busy_cores', '-')} of {outside.get('host_cores', '-')} |"
            )
    return "\n".join(lines)


def targets(results: list[dict]) -> list[str]:
    """Issue 43 target 2, read off the results (reported, never an exit code)."""
    out = []
    for tenants in sorted({r["tenants"] for r in results}):
        ok = {r["config"]: r for r in results if r["tenants"] == tenants and "failure" not in r}
        base = ok.get("1x0.25")
        if base and base["tenant_batches_per_s"]:
            for full in ("4x0.25", "2x0.5"):
                if full in ok:
                    need = 0.85 * 4 * base["tenant_batches_per_s"]
                    got = ok[full]["tenant_batches_per_s"]
                    out.append(
                        f"{tenants} tenants: {full} {got} tenant batches/s vs 0.85 x 4 x 1x0.25 "
                        f"= {need:.2f}: {'met' if got >= need else 'missed'}"
                    )
        for low, high in (("1x0.25", "2x0.25"), ("2x0.25", "4x0.25"), ("2x0.25", "2x0.5")):
            # The steady window's p95 when both windows opened after the first pass.
            key = (
                "window_lag_p95_s"
                if low in ok
                and high in ok
                and ok[low]["window_after_first_pass"]
                and ok[high]["window_after_first_pass"]
                else "lag_p95_s"
            )
            if low in ok and high in ok and ok[low][key]:
                ratio = ok[high][key] / ok[low][key]
                verdict = "met" if 0.4 <= ratio <= 0.6 else "missed"
                out.append(
                    f"{tenants} tenants: p95 lag ({key}) {high} / {low} = {ratio:.2f} "
                    f"(halving within 20 %: 0.40-0.60): {verdict}"
                )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--configs",
        nargs="+",
        type=parse_config,
        default=None,
        metavar="KxQ",
        help="K shard containers of Q cores each (default 1x0.25 2x0.25 4x0.25 2x0.5)",
    )
    parser.add_argument("--tenants", nargs="+", type=int, default=None, help="default 100 1000")
    parser.add_argument("--rate", type=int, default=200, help="ops/s the producer writes")
    parser.add_argument("--seconds", type=int, help="seconds of stream per config (90; --quick 60)")
    parser.add_argument(
        "--warmup", type=float, default=15.0, help="seconds after the first op before the window"
    )
    parser.add_argument(
        "--drain-cap", type=float, default=90.0, help="seconds to wait for the drain after"
    )
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--idle", type=float, default=5.0, help="idle seconds before the stream")
    parser.add_argument("--seed", type=int, default=43)
    parser.add_argument(
        "--run-seconds", type=int, default=1800, help="OML_SHARD_RUN_SECONDS of the shard runs"
    )
    parser.add_argument("--standing-timeout", type=float, default=420.0)
    parser.add_argument(
        "--counter-wait", type=float, default=20.0, help="seconds for the writers' last flush"
    )
    parser.add_argument(
        "--quick", action="store_true", help="1x0.25 and 2x0.25 at 100 tenants, 60 s of stream"
    )
    parser.add_argument("--no-build", action="store_true", help="the images are built already")
    parser.add_argument("--keep", action="store_true", help="leave the last config's stack up")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.configs = args.configs or [(1, 0.25), (2, 0.25)]
        args.tenants = args.tenants or [100]
        args.seconds = args.seconds or 60
        args.warmup = min(args.warmup, 10.0)
    args.seconds = args.seconds or 90
    args.configs = args.configs or [(1, 0.25), (2, 0.25), (4, 0.25), (2, 0.5)]
    args.tenants = args.tenants or [100, 1000]
    if args.warmup >= args.seconds:
        parser.error("--warmup must be shorter than --seconds")

    for name in ("POSTGRES_PASSWORD", "OML_WRITER_PASSWORD", "MINIO_ROOT_PASSWORD"):
        os.environ.setdefault(name, secrets.token_hex(12))
    os.environ.setdefault("OML_LAKE_SECRET_KEY", secrets.token_hex(12))
    os.environ["DOCKER_GID"] = str(os.stat("/var/run/docker.sock").st_gid)
    smoke.compose = compose  # the helpers of deploy/smoke.py on this override too

    started = time.monotonic()
    results: list[dict] = []
    failed = False
    try:
        if not args.no_build:
            smoke.build()
        for tenants in args.tenants:
            for k, q in args.configs:
                try:
                    results.append(measure(k, q, tenants, args))
                except (SmokeFailed, subprocess.TimeoutExpired, psycopg.Error) as exc:
                    failed = True
                    say(f"FAILED {k}x{q:g}, {tenants} tenants: {exc}")
                    results.append(
                        {
                            "config": f"{k}x{q:g}",
                            "shard_cores": k * q,
                            "tenants": tenants,
                            "failure": str(exc).splitlines()[0][:200],
                        }
                    )
    except (SmokeFailed, subprocess.TimeoutExpired) as exc:
        failed = True
        say(f"FAILED: {exc}")
    finally:
        if args.keep:
            say(f"kept the stack (project {smoke.PROJECT})")
        else:
            try:
                teardown()
            except (SmokeFailed, subprocess.TimeoutExpired) as exc:
                say(f"teardown: {exc}")
    report = {
        "rate_ops_s": args.rate,
        "stream_s": args.seconds,
        "warmup_s": args.warmup,
        "elapsed_s": round(time.monotonic() - started),
        "load_avg": os.getloadavg(),
        "cpus": os.cpu_count(),
        "results": results,
        "targets": targets(results),
    }
    print(table(results))
    for line in report["targets"]:
        print(line)
    print(f"elapsed {report['elapsed_s']} s")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
