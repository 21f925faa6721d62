"""Lag under a paced stream with a real `dagster-daemon` (issue 11, targets 1, 2 and 4).

For each config: a fresh lake database (migrated) and a fresh, empty Dagster storage database; a
fresh DAGSTER_HOME holding the repository's dagster.yaml (Postgres run and event storage, the
queued run coordinator, the per-tenant lease); `dagster-daemon run -w workspace.yaml` with the
outbox sensor at `--sensor-interval` seconds. Once the deployment is ready (the sensor has
ticked and, with standing shard runs (ADR 0032, the default), every shard's run has started;
their CPU over `--idle-seconds` with nothing to drain is reported), `oml-lake simulate
--rate R --duration D` streams over N tenants, and every second the bench samples:

- lag: the age of the oldest outbox row not yet drained into the core tables (unsequenced, or
  sequenced beyond the tenant's drained frontier, as the sensor reads it: the least `batch_end`
  of the tenant's tables, curated tables aside);
- the rows waiting unsequenced (and the oldest one's age), the backlog (ops not yet drained);
- the lake-writer runs queued, in progress and finished (Dagster's run storage), the load average.

After the stream it keeps sampling until the backlog is gone (or `--after-cap` seconds), then
waits for runs in flight to finish (standing runs do not: their CPU is read live, less what they
used before the stream). It reports p50/p95/max lag during the stream, when the
backlog was gone after it, the runs launched per minute, and the CPU seconds per run.

CPU per run: every run worker is a child process of a code server the daemon starts (a new one
each time the daemon refreshes its workspace, every 60 s), which reaps it, so the kernel adds the
worker's CPU time (its own children's included) to the code server's `cutime + cstime`
(/proc/<pid>/stat). Read once all runs have ended (a worker still there adds its own), that total
over the lake-writer runs that ended is the CPU per run (the maintenance, reconcile and analytics
schedules are moved out of the bench's window, so the stream's runs are the only ones). The
daemon's and the code servers' own CPU (queue, sensor ticks), the producer's and the Postgres
backends' of the two databases (sampled each second: a lower bound) are reported apart.

Where a run's wall time goes comes from Dagster's event log: queued, launch (process start,
imports, code location), drain (the lake work), report (the materialization events), finish.
Each run worker's CPU is sampled too: what it has used when its step starts is the cost of
starting a run.

`--profile DIR` runs py-spy (every thread, idle waits included, 20 Hz) over each standing shard
run's worker for the stream's duration, one raw file per worker under DIR/<config>; sum them with
`drain_profile.summarize`. The workers run slower under the sampler: read shares, not seconds.

    .venv/bin/python bench/lag_bench.py --config quick              # smoke run, ~2-3 minutes
    .venv/bin/python bench/lag_bench.py --config target1 target2 --json lag.json

The code location's settings pass through the environment as deployed: e.g.
`OML_RUN_DRAIN_SECONDS=0` measures one batch per run, `OML_DRAIN_SHARDS=0` one run per tenant
(ADR 0021) instead of one per shard of tenants (ADR 0027); `--max-concurrent-runs` replaces
dagster.yaml's run cap (as DAGSTER_MAX_CONCURRENT_RUNS does for deploy/dagster_home.sh).

Every process started (daemon, code server, run workers, producer) is stopped by its id at the
end, on Ctrl-C and on errors too, and both databases are dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg

try:
    from bench._support import ADMIN, fresh_database, machine
except ImportError:  # run as a script
    from _support import ADMIN, fresh_database, machine

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The lake-writer runs: one per tenant (ADR 0021, backfills) and one per shard of tenants (ADR 0027).
JOBS = ["lake_writer_job", "lake_writer_shard_job"]
# Far from any bench run: the nightly maintenance, reconcile and analytics schedules must not
# start runs in the measured window (they are not the stream's work).
NEVER_IN_WINDOW = "0 0 29 2 *"


@dataclass(frozen=True)
class Config:
    name: str
    rate: float  # outbox ops per second, over all tenants
    tenants: int
    duration: float  # seconds of stream
    # Targets of issue 11 (None: a smoke size, no target).
    p95_target_s: float | None = None
    gone_target_s: float | None = None


CONFIGS = {
    "quick": Config("quick", 50, 5, 30),
    "target1": Config("target1", 200, 10, 120, p95_target_s=10, gone_target_s=90),
    "target2": Config("target2", 700, 100, 120, p95_target_s=30, gone_target_s=90),
    # Issue 35's targets 1 and 2: the same stream, tighter over 100 tenants, and over 1,000.
    "i35-100": Config("i35-100", 700, 100, 120, p95_target_s=10, gone_target_s=30),
    "i35-1000": Config("i35-1000", 700, 1000, 120, p95_target_s=30, gone_target_s=90),
}

# Everything not drained, as the sensor sees a tenant's drained frontier (sequencer.pending_tenants).
_SAMPLE = """
WITH drained AS (
    SELECT tenant_id, min(batch_end) AS through FROM oml.lake_frontier
    WHERE table_name NOT LIKE 'gold.curated/%' GROUP BY tenant_id
), sequenced AS (
    SELECT count(*) AS n, min(o.created_at) AS oldest
    FROM oml.sequencer_tenant s
    LEFT JOIN drained d ON d.tenant_id = s.tenant_id
    JOIN oml.outbox o ON o.tenant_id = s.tenant_id AND o.seq > COALESCE(d.through, 0)
), unsequenced AS (
    SELECT count(*) AS n, min(created_at) AS oldest FROM oml.outbox WHERE seq IS NULL
)
SELECT clock_timestamp(), s.n, s.oldest, u.n, u.oldest FROM sequenced s, unsequenced u
"""


def _age(now, oldest) -> float:
    return max((now - oldest).total_seconds(), 0.0) if oldest is not None else 0.0


def _with_db(dsn: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)


@contextlib.contextmanager
def empty_database(prefix: str) -> Iterator[str]:
    """A fresh database with nothing in it (Dagster creates its own tables), dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_db(ADMIN, name)
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- processes ----------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat fields after the command name: [0] state, [1] ppid, [11] utime,
    [12] stime, [13] cutime, [14] cstime (clock ticks), [19] start time."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(root: int) -> list[int]:
    """The live processes under `root` (not root itself), from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(own CPU seconds, CPU seconds of its reaped children) of a live process."""
    fields = _stat(pid)
    if not fields:
        return 0.0, 0.0
    own = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return own, (int(fields[13]) + int(fields[14])) / CLK_TCK


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class ProcessCpu:
    """CPU seconds of the processes under the daemon, sampled from /proc every second and kept
    per process id with its kind: the code servers (`dagster api grpc`), the run workers (their
    multiprocessing children), the rest."""

    def __init__(self, daemon: int):
        self.daemon = daemon
        self.last: dict[int, tuple[str, float, float]] = {}  # pid -> (kind, own, reaped children)
        self.first_children: dict[int, float] = {}
        self.started: dict[int, str] = {}  # pid -> start time, so a reused pid is never ours
        # Each run worker's CPU over time: [(epoch seconds, own + reaped children CPU)].
        self.series: dict[int, list[tuple[float, float]]] = {}

    @staticmethod
    def kind(pid: int) -> str:
        line = cmdline(pid)
        if "dagster api grpc" in line:
            return "code_server"
        if "multiprocessing.spawn" in line:
            return "run_worker"
        return "other"

    def sample(self) -> list[int]:
        pids = descendants(self.daemon)
        for pid in pids:
            kind = self.last[pid][0] if pid in self.last else self.kind(pid)
            own, children = cpu_seconds(pid)
            if pid not in self.last:
                self.first_children[pid] = children
                self.started[pid] = (_stat(pid) or [""] * 20)[19]
            self.last[pid] = (kind, own, children)
            if kind == "run_worker":
                self.series.setdefault(pid, []).append((time.time(), own + children))
        return pids

    def survivors(self) -> list[int]:
        """Processes seen under the daemon that are still running (not zombies), same start."""
        return [pid for pid, started in self.started.items() if _started(pid) == started]

    def of(self, kind: str) -> list[int]:
        return [pid for pid, (k, _, _) in self.last.items() if k == kind]

    def run_workers_s(self, alive: set[int]) -> float:
        """Run workers' CPU: what the code servers reaped since the start, plus the workers still
        there (or not yet reaped), own and children."""
        reaped = sum(self.last[p][2] - self.first_children[p] for p in self.of("code_server"))
        live = sum(self.last[p][1] + self.last[p][2] for p in self.of("run_worker") if p in alive)
        return reaped + live

    def own_s(self, kind: str) -> float:
        return sum(self.last[p][1] for p in self.of(kind))


def _started(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[19] if fields and fields[0] != "Z" else None


def stop(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """Stop a process we started and every process under it, each by its id: SIGTERM to the
    top (the daemon shuts its code servers and runs down), then SIGKILL to what is left of the
    tree as it was before (a process that kept its start time is the same process)."""
    tree = {pid: _started(pid) for pid in descendants(proc.pid)}
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    tree.update({pid: _started(pid) for pid in descendants(proc.pid)})
    if proc.poll() is None:
        proc.kill()
    for pid, started in tree.items():
        if started is not None and _started(pid) == started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


# --- the Dagster deployment ---------------------------------------------------------------------


@contextlib.contextmanager
def deployment(
    lake_dsn: str, dagster_dsn: str, work: Path, sensor_interval: int, max_runs: int | None
):
    """dagster-daemon on a fresh DAGSTER_HOME rendered from the repository's dagster.yaml as a
    deployment renders it (deploy/dagster_home.sh; `max_runs` replaces its global run cap),
    stopped after."""
    home = work / "dagster_home"
    render_env = dict(os.environ)
    render_env.pop("DAGSTER_MAX_CONCURRENT_RUNS", None)
    if max_runs is not None:
        render_env["DAGSTER_MAX_CONCURRENT_RUNS"] = str(max_runs)
    subprocess.run(
        [str(REPO / "deploy" / "dagster_home.sh"), str(home)],
        env=render_env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    info = psycopg.conninfo.conninfo_to_dict(dagster_dsn)
    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(home),
        DAGSTER_PG_HOST=info.get("host") or "127.0.0.1",
        DAGSTER_PG_PORT=str(info.get("port") or 5432),
        DAGSTER_PG_USER=info.get("user") or "postgres",
        DAGSTER_PG_PASSWORD=info.get("password") or "",
        DAGSTER_PG_DB=info["dbname"],
        OML_PG_DSN=lake_dsn,
        OML_LAKE_URI=str(work / "lake"),
        OML_SENSOR_INTERVAL_SECONDS=str(sensor_interval),
        OML_DAGSTER_AUTOSTART="1",
        OML_RECONCILE_CRON=NEVER_IN_WINDOW,
        OML_COMPACT_CRON=NEVER_IN_WINDOW,
        OML_ZORDER_CRON=NEVER_IN_WINDOW,
        OML_VACUUM_CRON=NEVER_IN_WINDOW,
        OML_ANALYTICS_CRON=NEVER_IN_WINDOW,
    )
    (work / "lake").mkdir()
    daemon_bin = Path(sys.executable).parent / "dagster-daemon"
    log = open(work / "daemon.log", "w")  # noqa: SIM115 (closed below)
    # Its own session: a Ctrl-C at the terminal reaches only the bench, which stops it in order.
    proc = subprocess.Popen(
        [str(daemon_bin), "run", "-w", str(REPO / "workspace.yaml")],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield proc, env
    finally:
        stop(proc)
        log.close()


def wait_for_sensor(dagster: psycopg.Connection, proc: subprocess.Popen, timeout: float) -> float:
    """Seconds until the daemon has recorded the outbox sensor's first tick."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(
                f"dagster-daemon exited with {proc.returncode} before the first tick"
            )
        with contextlib.suppress(psycopg.errors.UndefinedTable):
            if dagster.execute("SELECT 1 FROM job_ticks WHERE type = 'SENSOR' LIMIT 1").fetchone():
                return time.monotonic() - started
        time.sleep(1)
    raise RuntimeError(f"no sensor tick within {timeout:.0f} s (see the daemon log)")


def standing_shards() -> int:
    """How many standing shard runs the deployment keeps (ADR 0032): OML_DRAIN_SHARDS unless
    OML_SHARD_STANDING (or a 0 s OML_SHARD_RUN_SECONDS) switches them off, as the code location
    reads them."""
    from oml_dagster.settings import DRAIN_SHARDS, SHARD_RUN_SECONDS, SHARD_STANDING

    if not SHARD_STANDING.read() or not SHARD_RUN_SECONDS.read():
        return 0
    return DRAIN_SHARDS.read()


def wait_for_standing_runs(
    dagster: psycopg.Connection, proc: subprocess.Popen, shards: int, cpu, timeout: float
) -> float:
    """Seconds until every shard's standing run has started."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"dagster-daemon exited with {proc.returncode}")
        cpu.sample()
        if run_counts(dagster).get("STARTED", 0) >= shards:
            return time.monotonic() - started
        time.sleep(1)
    raise RuntimeError(f"{shards} standing shard runs not started within {timeout:.0f} s")


def idle_cost(cpu, daemon: int, seconds: float) -> dict:
    """CPU of the standing runs, the daemon and the code servers over `seconds` with nothing to
    drain (before the stream)."""
    alive = set(cpu.sample())
    runs0, daemon0 = cpu.run_workers_s(alive), cpu_seconds(daemon)[0]
    servers0 = cpu.own_s("code_server")
    time.sleep(seconds)
    alive = set(cpu.sample())
    runs1, daemon1 = cpu.run_workers_s(alive), cpu_seconds(daemon)[0]
    return {
        "seconds": seconds,
        "run_workers_cpu_s": round(runs1 - runs0, 2),
        "run_workers_pct_of_a_core": round(100 * (runs1 - runs0) / seconds, 1),
        "daemon_and_code_servers_cpu_s": round(
            daemon1 - daemon0 + cpu.own_s("code_server") - servers0, 2
        ),
        # The runs' CPU up to the stream (start and idle): not the stream's work.
        "base_run_cpu_s": round(runs1, 2),
    }


def run_counts(dagster: psycopg.Connection) -> dict[str, int]:
    rows = dagster.execute(
        "SELECT status, count(*) FROM runs WHERE pipeline_name = ANY(%s) GROUP BY status", (JOBS,)
    ).fetchall()
    return dict(rows)


def run_times(
    dagster: psycopg.Connection,
) -> list[tuple[str, float | None, float | None, float | None]]:
    """(status, launched, start, end) of every lake-writer run as epoch seconds: launched is when
    the queue launched it (RUN_STARTING), start when its worker began (RUN_START)."""
    return dagster.execute(
        "SELECT r.status, extract(epoch FROM min(e.timestamp) AT TIME ZONE 'UTC')::float8,"
        " r.start_time, r.end_time FROM runs r LEFT JOIN event_logs e ON e.run_id = r.run_id"
        " AND e.dagster_event_type = 'PIPELINE_STARTING' WHERE r.pipeline_name = ANY(%s)"
        " GROUP BY r.run_id, r.status, r.start_time, r.end_time",
        (JOBS,),
    ).fetchall()


IN_FLIGHT = ("NOT_STARTED", "QUEUED", "STARTING", "STARTED", "CANCELING")


# --- one config ---------------------------------------------------------------------------------


def sample_run_workers(cpu: ProcessCpu, into: Path, seconds: float) -> list[subprocess.Popen]:
    """py-spy over every thread of each run worker alive now (a standing shard run's, started
    before the stream), idle waits included, for the stream's `seconds`: one raw (collapsed
    stacks) file per worker in `into`, read with `drain_profile.summarize`."""
    into.mkdir(parents=True, exist_ok=True)
    beside = Path(sys.executable).parent / "py-spy"
    spies = []
    for pid in cpu.of("run_worker"):
        if _started(pid) is None:
            continue
        cmd = [str(beside) if beside.exists() else "py-spy", "record", "--pid", str(pid)]
        cmd += ["--idle", "--threads", "--rate", "20", "--duration", str(int(seconds))]
        cmd += ["--format", "raw", "--output", str(into / f"run_worker_{pid}.raw")]
        log = open(into / f"run_worker_{pid}.py-spy.log", "w")  # noqa: SIM115
        spies.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
    return spies


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _load() -> tuple[float, float, float]:
    return os.getloadavg()


def measure(
    config: Config,
    *,
    sensor_interval: int,
    max_runs: int | None,
    after_cap: float,
    claims: int,
    writers: int,
    seed: int,
    keep: Path | None,
    idle_seconds: float = 20.0,
    profile: Path | None = None,
) -> dict:
    result: dict = {
        "config": asdict(config),
        "sensor_interval_s": sensor_interval,
        "max_concurrent_runs": max_runs or "dagster.yaml",
        "run_drain_seconds": os.environ.get("OML_RUN_DRAIN_SECONDS") or "default",
        "drain_shards": os.environ.get("OML_DRAIN_SHARDS") or "default",
        "standing_shard_runs": standing_shards(),
    }
    result["load_before"] = _load()
    work = Path(tempfile.mkdtemp(prefix="oml_lag_bench_"))
    cpu: ProcessCpu | None = None
    try:
        with (
            fresh_database("oml_lag_bench") as lake_dsn,
            empty_database("oml_lag_bench_dagster") as dagster_dsn,
            psycopg.connect(lake_dsn, autocommit=True) as lake,
            psycopg.connect(dagster_dsn, autocommit=True) as dagster,
            deployment(lake_dsn, dagster_dsn, work, sensor_interval, max_runs) as (daemon, env),
            contextlib.ExitStack() as cleanup,  # left first: the producer before the daemon
        ):
            result["daemon_ready_s"] = round(wait_for_sensor(dagster, daemon, timeout=300), 1)
            cpu = ProcessCpu(daemon.pid)
            cpu.sample()
            if standing_shards():
                # A deployment with standing shard runs (ADR 0032) is ready once each shard's
                # run is up; what they cost while nothing flows is measured before the stream.
                result["writers_ready_s"] = round(
                    wait_for_standing_runs(dagster, daemon, standing_shards(), cpu, timeout=300),
                    1,
                )
                result["idle"] = idle_cost(cpu, daemon.pid, idle_seconds)
            daemon_cpu0, _ = cpu_seconds(daemon.pid)
            backends = BackendCpu(lake, [_dbname(lake_dsn), _dbname(dagster_dsn)])

            producer_log = open(work / "simulate.log", "w")  # noqa: SIM115
            started = time.monotonic()
            started_wall = time.time()
            producer = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "oml-lake"),
                    "simulate",
                    f"--tenants={config.tenants}",
                    f"--claims={claims}",
                    f"--seed={seed}",
                    f"--rate={config.rate:g}",
                    f"--duration={config.duration:g}",
                    f"--writers={writers}",
                    "--no-progress",
                ],
                env=env,
                stdout=producer_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            cleanup.callback(producer_log.close)
            cleanup.callback(stop, producer, grace=5)
            if profile is not None:
                for spy in sample_run_workers(cpu, profile, config.duration):
                    cleanup.callback(stop, spy, grace=10)
            samples: list[dict] = []
            stream_end: float | None = None
            producer_cpu = None
            gone_at: float | None = None
            while True:
                tick = time.monotonic()
                t = tick - started
                cpu.sample()
                backends.sample()
                now, backlog, oldest_seq, unseq, oldest_unseq = lake.execute(_SAMPLE).fetchone()
                oldest = min((x for x in (oldest_seq, oldest_unseq) if x is not None), default=None)
                counts = run_counts(dagster)
                sample = {
                    "t": round(t, 2),
                    "streaming": stream_end is None,
                    "lag_s": round(_age(now, oldest), 2),
                    "backlog_ops": backlog + unseq,
                    "unsequenced_ops": unseq,
                    "unsequenced_age_s": round(_age(now, oldest_unseq), 2),
                    "runs_queued": sum(counts.get(s, 0) for s in ("NOT_STARTED", "QUEUED")),
                    "runs_in_progress": sum(counts.get(s, 0) for s in ("STARTING", "STARTED")),
                    "runs_done": counts.get("SUCCESS", 0) + counts.get("FAILURE", 0),
                    "load1": os.getloadavg()[0],
                }
                samples.append(sample)
                if stream_end is None:
                    pid, status, usage = os.wait4(producer.pid, os.WNOHANG)
                    if pid:
                        producer.returncode = os.waitstatus_to_exitcode(status)
                        stream_end = t
                        producer_cpu = usage.ru_utime + usage.ru_stime
                        if producer.returncode != 0:
                            raise RuntimeError(
                                f"oml-lake simulate failed ({producer.returncode}): "
                                + (work / "simulate.log").read_text()[-2000:]
                            )
                elif sample["backlog_ops"] == 0:
                    gone_at = t
                    break
                elif t - stream_end > after_cap:
                    break
                if daemon.poll() is not None:
                    raise RuntimeError(f"dagster-daemon exited with {daemon.returncode}")
                time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))

            # Let the runs in flight end and their workers exit, so that every worker's CPU is
            # in its code server's reaped-children time (standing runs do not end: their
            # workers' CPU is read live).
            settle = time.monotonic()
            while not standing_shards() and time.monotonic() - settle < 120:
                alive = set(cpu.sample())
                counts = run_counts(dagster)
                busy = any(counts.get(s, 0) for s in IN_FLIGHT)
                if not busy and not [p for p in cpu.of("run_worker") if p in alive]:
                    break
                time.sleep(1)
            alive = set(cpu.sample())
            backends.sample()
            daemon_cpu1, _ = cpu_seconds(daemon.pid)
            times = run_times(dagster)
            counts = run_counts(dagster)
            result["load_after"] = _load()
            result.update(
                summarize(
                    config, samples, stream_end, gone_at, times, counts, started_wall, after_cap
                )
            )
            ended = [t for t in times if t[0] in ("SUCCESS", "FAILURE", "CANCELED")]
            runs_cpu = cpu.run_workers_s(alive) - result.get("idle", {}).get("base_run_cpu_s", 0)
            live = len([p for p in cpu.of("run_worker") if p in alive])
            result["cpu"] = {
                "run_workers_s": round(runs_cpu, 1),
                "runs_ended": len(ended),
                "per_run_s": round(runs_cpu / (len(ended) + live), 2) if ended or live else None,
                "run_workers_still_alive": live,
                "code_servers": len(cpu.of("code_server")),
                "code_server_own_s": round(cpu.own_s("code_server"), 1),
                "daemon_own_s": round(daemon_cpu1 - daemon_cpu0, 1),
                "producer_s": round(producer_cpu, 1) if producer_cpu is not None else None,
                "postgres_backends_sampled_s": round(backends.total_s(), 1),
            }
            batches = tenant_batches(work / "lake")
            result["cpu"]["tenant_batches"] = batches
            result["cpu"]["run_cpu_ms_per_tenant_batch"] = (
                round(1000 * runs_cpu / batches, 1) if batches else None
            )
            result["run_phases"] = run_phases(dagster)
            result["cpu"].update(start_cpu(dagster, cpu))
            report = (work / "simulate.log").read_text()
            result["producer_report"] = report[-1500:]
            # The pace the producer reached ("N ops in T s = R ops/s"): short of the asked rate
            # when the machine cannot write faster.
            written = re.search(r"(\d+) ops in ([\d.]+) s", report)
            if written:
                result["ops_written"] = int(written[1])
                result["ops_per_s_written"] = round(int(written[1]) / float(written[2]), 1)
            if result.get("ops_written"):
                result["cpu"]["run_cpu_s_per_1000_ops"] = round(
                    1000 * runs_cpu / result["ops_written"], 2
                )
                everything = sum(
                    result["cpu"][k] or 0
                    for k in (
                        "run_workers_s",
                        "code_server_own_s",
                        "daemon_own_s",
                        "producer_s",
                        "postgres_backends_sampled_s",
                    )
                )
                result["cpu"]["all_cpu_s_per_1000_ops"] = round(
                    1000 * everything / result["ops_written"], 2
                )
            result["samples"] = samples
    finally:
        # Anything under the daemon that outlived it (the daemon is stopped on leaving the
        # `with`): ours, stopped by its id.
        leftovers = cpu.survivors() if cpu else []
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        result["leftover_processes_killed"] = len(leftovers)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for name in ("daemon.log", "simulate.log"):
                if (work / name).exists():
                    shutil.copy(work / name, keep / f"{config.name}-{name}")
        shutil.rmtree(work, ignore_errors=True)
    return result


def tenant_batches(lake: Path) -> int:
    """Tenant batches the writer committed: every batch appends to its tenant's bronze.events
    (each act journals an event), so the count of bronze commits that were writes (not the
    packing's OPTIMIZE) over every tenant."""
    count = 0
    for log in lake.glob("*/bronze/events/_delta_log/*.json"):
        with contextlib.suppress(OSError), open(log) as f:
            for entry in f:
                if '"commitInfo"' in entry:
                    operation = json.loads(entry)["commitInfo"].get("operation", "")
                    count += operation in ("WRITE", "CREATE TABLE", "MERGE")
                    break
    return count


def _dbname(dsn: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]


class BackendCpu:
    """CPU seconds of the Postgres backends serving the bench's two databases, sampled each
    second (a backend that lives less than a second between samples is missed: a lower bound)."""

    def __init__(self, conn: psycopg.Connection, databases: list[str]):
        self.conn, self.databases = conn, databases
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}

    def sample(self) -> None:
        pids = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = ANY(%s)", (self.databases,)
        ).fetchall()
        for (pid,) in pids:
            own, _ = cpu_seconds(pid)
            self.first.setdefault(pid, own)
            self.last[pid] = own

    def total_s(self) -> float:
        return sum(self.last[p] - self.first[p] for p in self.last)


def start_cpu(dagster: psycopg.Connection, cpu: ProcessCpu) -> dict:
    """How much of a run worker's CPU is spent before its step starts (process start, imports,
    the code location, the instance): the worker's CPU at the last sample before the run's
    STEP_START (a lower bound, up to a second short), against its CPU at its last sample (up to a
    second short too). The worker is found by the pid Dagster records in the run's events."""
    rows = dagster.execute(
        "SELECT e.run_id, e.event, e.timestamp FROM event_logs e JOIN runs r"
        " ON r.run_id = e.run_id WHERE r.pipeline_name = ANY(%s)"
        " AND e.dagster_event_type = 'STEP_START'",
        (JOBS,),
    ).fetchall()
    before_step, total = [], []
    for _, event, at in rows:
        pid = (json.loads(event).get("dagster_event") or {}).get("pid")
        series = cpu.series.get(pid) or []
        step_at = at.replace(tzinfo=dt.UTC).timestamp()
        earlier = [used for when, used in series if when <= step_at]
        if earlier:
            before_step.append(earlier[-1])
            total.append(series[-1][1])
    if not before_step:
        return {}
    return {
        "worker_before_step_median_s": round(statistics.median(before_step), 2),
        "worker_sampled_median_s": round(statistics.median(total), 2),
        "workers_matched": len(before_step),
    }


# Where a run's wall time goes, from Dagster's own event log (legacy event type names).
_PHASES = {
    "queued": ("PIPELINE_ENQUEUED", "PIPELINE_STARTING"),
    "launch": ("PIPELINE_STARTING", "PIPELINE_START"),
    "to_step": ("PIPELINE_START", "STEP_START"),
    "drain": ("STEP_START", "ASSET_MATERIALIZATION"),
    "report": ("ASSET_MATERIALIZATION", "STEP_SUCCESS"),
    "finish": ("STEP_SUCCESS", "PIPELINE_SUCCESS"),
}


def run_phases(dagster: psycopg.Connection) -> dict:
    """Median and max seconds of each phase over the lake-writer runs: queued (enqueued until the
    queue launches it), launch (the worker process started, imports, code location, instance),
    to_step, drain (step start to its first materialization: the lake work), report (the
    materialization events), finish. Launch is wall time: on a loaded machine it stretches."""
    rows = dagster.execute(
        "SELECT e.run_id, e.dagster_event_type, min(e.timestamp) FROM event_logs e"
        " JOIN runs r ON r.run_id = e.run_id WHERE r.pipeline_name = ANY(%s)"
        " AND e.dagster_event_type = ANY(%s) GROUP BY 1, 2",
        (JOBS, sorted({t for pair in _PHASES.values() for t in pair})),
    ).fetchall()
    at: dict[str, dict[str, object]] = {}
    for run_id, kind, ts in rows:
        at.setdefault(run_id, {})[kind] = ts
    out = {}
    for phase, (a, b) in _PHASES.items():
        spans = [(r[b] - r[a]).total_seconds() for r in at.values() if a in r and b in r]
        if spans:
            out[phase] = {
                "median_s": round(statistics.median(spans), 2),
                "max_s": round(max(spans), 2),
                "runs": len(spans),
            }
    return out


def summarize(config, samples, stream_end, gone_at, times, counts, started_wall, after_cap):
    # The stream starts with its first op, not with the producer's process: creating the tenants
    # first takes a while, and those samples (nothing to drain) would flatter the percentiles.
    first_op = next((s["t"] for s in samples if s["backlog_ops"] > 0), 0.0)
    during = [s["lag_s"] for s in samples if s["streaming"] and s["t"] >= first_op]
    stream_seconds = max((stream_end or config.duration) - first_op, 1.0)
    window = (samples[-1]["t"] if samples else stream_seconds) - first_op
    launched = [at - started_wall - first_op for _, at, _, _ in times if at is not None]
    durations = [end - st for _, _, st, end in times if st is not None and end is not None]
    loads = [s["load1"] for s in samples]
    gone_after = (gone_at - stream_end) if gone_at is not None and stream_end is not None else None
    out = {
        "stream_s": round(stream_seconds, 1),
        "first_op_s": first_op,
        "lag_p50_s": round(_pct(during, 0.50), 1),
        "lag_p95_s": round(_pct(during, 0.95), 1),
        "lag_max_s": round(max(during, default=0.0), 1),
        "unsequenced_max_ops": max((s["unsequenced_ops"] for s in samples), default=0),
        "unsequenced_age_max_s": max((s["unsequenced_age_s"] for s in samples), default=0.0),
        "backlog_max_ops": max((s["backlog_ops"] for s in samples), default=0),
        "backlog_at_stream_end": next(
            (s["backlog_ops"] for s in samples if not s["streaming"]), None
        ),
        "backlog_gone_after_s": round(gone_after, 1) if gone_after is not None else None,
        "after_cap_s": after_cap,
        "runs_total": sum(counts.values()),
        "runs_by_status": counts,
        "runs_launched_per_min_during_stream": round(
            sum(0 <= t <= stream_seconds for t in launched) * 60 / stream_seconds, 1
        ),
        "runs_launched_per_min_overall": round(
            sum(0 <= t <= window for t in launched) * 60 / max(window, 1.0), 1
        ),
        "measured_s": round(window, 1),
        "run_duration_p50_s": round(statistics.median(durations), 2) if durations else None,
        "run_duration_max_s": round(max(durations), 2) if durations else None,
        "load1_mean": round(statistics.fmean(loads), 2) if loads else None,
        "load1_max": round(max(loads), 2) if loads else None,
    }
    if config.p95_target_s is not None:
        out["target_p95_met"] = out["lag_p95_s"] <= config.p95_target_s
        out["target_gone_met"] = gone_after is not None and gone_after <= config.gone_target_s
    return out


def line(r: dict) -> str:
    c, cpu = r["config"], r["cpu"]
    gone = r["backlog_gone_after_s"]
    return (
        f"{c['name']}: {c['rate']:g} ops/s over {c['tenants']} tenants for {r['stream_s']:.0f} s"
        f" ({r.get('ops_written')} ops written, {r.get('ops_per_s_written')} ops/s):"
        f" lag p50 {r['lag_p50_s']:.1f} s, p95 {r['lag_p95_s']:.1f} s, max {r['lag_max_s']:.1f} s;"
        f" backlog max {r['backlog_max_ops']} ops ({r['unsequenced_max_ops']} unsequenced, oldest"
        f" {r['unsequenced_age_max_s']:.0f} s); "
        + (
            f"gone {gone:.0f} s after the stream"
            if gone is not None
            else f"NOT gone {r['after_cap_s']:.0f} s after"
        )
        + f"; runs {r['runs_total']} (launched {r['runs_launched_per_min_during_stream']:.1f}/min"
        f" during the stream, {r['runs_launched_per_min_overall']:.1f}/min over the"
        f" {r['measured_s']:.0f} s measured; median {r['run_duration_p50_s']} s each); CPU per run"
        f" {cpu['per_run_s']} s ({cpu['run_workers_s']} s over {cpu['runs_ended']} runs; code"
        f" server {cpu['code_server_own_s']} s, daemon {cpu['daemon_own_s']} s, producer"
        f" {cpu['producer_s']} s, Postgres backends >= {cpu['postgres_backends_sampled_s']} s"
        f"; {cpu['run_workers_still_alive']} workers still running);"
        f" runs' CPU per 1,000 ops {cpu.get('run_cpu_s_per_1000_ops')} s (everything's"
        f" {cpu.get('all_cpu_s_per_1000_ops')} s), per tenant batch"
        f" {cpu.get('run_cpu_ms_per_tenant_batch')} ms ({cpu.get('tenant_batches')} batches);"
        f" load 1-min mean {r['load1_mean']}, max {r['load1_max']}"
        f" (before {r['load_before'][0]:.2f}, after {r['load_after'][0]:.2f})\n  run phases"
        " (median / max s): "
        + ", ".join(
            f"{k} {v['median_s']:.1f} / {v['max_s']:.1f}" for k, v in r["run_phases"].items()
        )
        + (
            f"\n  standing shard runs: {r['standing_shard_runs']}, all started"
            f" {r['writers_ready_s']} s after the first tick; idle over"
            f" {r['idle']['seconds']:g} s before the stream: runs"
            f" {r['idle']['run_workers_pct_of_a_core']} % of a core, daemon and code servers"
            f" {r['idle']['daemon_and_code_servers_cpu_s']} s"
            if r.get("idle")
            else ""
        )
        + (
            f"\n  a worker's CPU before its step starts: median"
            f" {cpu['worker_before_step_median_s']} s of {cpu['worker_sampled_median_s']} s"
            f" sampled ({cpu['workers_matched']} workers)"
            if "worker_before_step_median_s" in cpu
            else ""
        )
    )


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config", nargs="+", choices=sorted(CONFIGS), default=["target1", "target2"]
    )
    parser.add_argument("--rate", type=float, help="override the configs' ops/s")
    parser.add_argument("--tenants", type=int, help="override the configs' tenant count")
    parser.add_argument("--duration", type=float, help="override the configs' stream seconds")
    parser.add_argument("--sensor-interval", type=int, default=5, help="seconds (default 5)")
    parser.add_argument(
        "--max-concurrent-runs",
        type=int,
        help="replace dagster.yaml's global run cap (default: as in dagster.yaml)",
    )
    parser.add_argument(
        "--after-cap", type=float, default=300, help="seconds to wait for the backlog after"
    )
    parser.add_argument("--claims", type=int, default=5000, help="claims per tenant (ample)")
    parser.add_argument("--writers", type=int, default=4, help="producer connections")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=20,
        help="with standing shard runs: seconds their idle CPU is measured before the stream",
    )
    parser.add_argument("--json", help="write figures and the lag series to this path")
    parser.add_argument("--logs", help="keep the daemon's and producer's logs in this folder")
    parser.add_argument(
        "--profile",
        help="py-spy over each standing shard run's worker during the stream: raw files here",
    )
    args = parser.parse_args()

    # SIGTERM and SIGINT (even when started in the background, where SIGINT comes ignored) end
    # the bench through every `finally` that stops processes and drops databases.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    print(machine(), flush=True)
    results = []
    for name in args.config:
        config = CONFIGS[name]
        overrides = {
            k: v
            for k, v in (
                ("rate", args.rate),
                ("tenants", args.tenants),
                ("duration", args.duration),
            )
            if v is not None
        }
        if overrides:
            config = Config(**{**asdict(config), **overrides})
        print(
            f"== {config.name}: {config.rate:g} ops/s, {config.tenants} tenants, "
            f"{config.duration:g} s; sensor every {args.sensor_interval} s, run cap"
            f" {args.max_concurrent_runs or 'as in dagster.yaml'}, OML_RUN_DRAIN_SECONDS"
            f" {os.environ.get('OML_RUN_DRAIN_SECONDS') or 'default'}, OML_DRAIN_SHARDS"
            f" {os.environ.get('OML_DRAIN_SHARDS') or 'default'};"
            f" load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        started = time.monotonic()
        r = measure(
            config,
            sensor_interval=args.sensor_interval,
            max_runs=args.max_concurrent_runs,
            after_cap=args.after_cap,
            claims=args.claims,
            writers=args.writers,
            seed=args.seed,
            keep=Path(args.logs) if args.logs else None,
            idle_seconds=args.idle_seconds,
            profile=Path(args.profile) / config.name if args.profile else None,
        )
        print(line(r) + f"\n  took {time.monotonic() - started:.0f} s", flush=True)
        if "target_p95_met" in r:
            print(
                f"  targets: p95 <= {config.p95_target_s:g} s "
                f"{'met' if r['target_p95_met'] else 'NOT met'}; backlog gone <= "
                f"{config.gone_target_s:g} s {'met' if r['target_gone_met'] else 'NOT met'}",
                flush=True,
            )
        results.append(r)
        if args.json:  # after each config, so a long run keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"machine": machine(), "results": results}, f, indent=1)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted: every process stopped, the databases dropped", file=sys.stderr)
        sys.exit(130)
