"""The chaos soak: the compose stack (compose.yaml + compose.ci.yaml + compose.soak.yaml, every
server on loopback) streaming a simulated workload for a set time while faults come from a
seeded schedule, one every 30-90 s; then every tenant's lake is checked exact against a
fault-free drain of the same outbox, `oml-lake reconcile` must agree, no dead letter may be open
but those of the bad ops the simulator injected, and the lag must be back under the bound within
a stated time of the last fault. deploy/soak.sh runs it (Docker set up as deploy/smoke.sh does).

    deploy/soak.sh                      10 minutes of faults (the benchmark)
    deploy/soak.sh --seconds 120 --gaps 20 40    the short form (CI)
    deploy/soak.sh --seed 7 --json out.json

The faults, drawn in seeded rounds (each kind once per round, in a shuffled order), one every
30-90 s (`--gaps`):
  pg_fast       PostgreSQL stopped with SIGINT (its fast shutdown) and started again
  pg_immediate  the PostgreSQL container killed (SIGKILL: crash recovery) and started again
  s3_restart    the S3 endpoint down 5-15 s: the fault proxy in front of moto resets every
                connection, as while a server restarts (moto keeps its objects in memory: a
                restart of its own container would lose the lake)
  s3_errors     the proxy's 10 % errors (503 SlowDown, 500, resets before and after, cut bodies)
                switched on for 30-60 s, then off
  code_kill     the code server's container killed, started again
  daemon_kill   the daemon's container killed, started again
  run_kill      a running lake-writer run container killed (run monitoring fails the run, the
                sensor or run retries launch another)
Each fault's recovery time is the time until the service is healthy again. Figures (faults,
recoveries, runs failed and relaunched, the lag) are printed and written as JSON (`--json`).
Python's standard library only, as deploy/smoke.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import drills  # noqa: E402
import smoke  # noqa: E402
from smoke import SmokeFailed, run, say  # noqa: E402

from oml_testbed.fault_proxy import FaultProxy  # noqa: E402  (standard library only)

PROXY_PORT = os.environ.setdefault("OML_SOAK_PROXY_PORT", "19001")
KINDS = (
    "pg_fast",
    "pg_immediate",
    "s3_restart",
    "s3_errors",
    "code_kill",
    "daemon_kill",
    "run_kill",
)
LAKE_JOBS = ("lake_writer_shard_job", "lake_writer_job")


def wait_stack(timeout: float = 900) -> None:
    """Every service healthy (the daemon: running), the one-shot services exited 0."""
    for service in smoke.SERVICES:
        wait_service(service, timeout=timeout)
    for service in smoke.ONE_SHOT:
        state = json.loads(run("docker", "inspect", smoke.container(service)))[0]["State"]
        if state["ExitCode"] != 0:
            raise SmokeFailed(f"{service} exited {state['ExitCode']}")


def compose(*args: str, timeout: float = 900) -> str:
    files = [
        "-f", str(smoke.DOCKER / "compose.yaml"),
        "-f", str(smoke.DOCKER / "compose.ci.yaml"),
        "-f", str(smoke.DOCKER / "compose.soak.yaml"),
    ]  # fmt: skip
    return run("docker-compose", "-p", smoke.PROJECT, *files, *args, timeout=timeout)


# The daemon's and the code server's health checks (`dagster-daemon liveness-check`, `dagster api
# grpc-health-check`: a Python start each) do not answer within their timeouts (20 s, 10 s) on a
# machine as loaded as this shared one was (load average 20-40 on 2 CPUs) while the services
# themselves work (the daemon launches runs, the code server serves their sensor ticks): for
# them, running is what is waited for; convergence afterwards says whether they served.
RUNNING_IS_ENOUGH = ("daemon", "code")


def wait_service(service: str, timeout: float = 600) -> float:
    """Seconds until `service` runs and is healthy again (the daemon and the code server: runs).
    A killed container keeps its last health status, and `docker kill` leaves it stopped whatever
    its restart policy: whether it runs is read first, and a stopped one is started."""
    started = time.monotonic()

    def healthy():
        state = json.loads(run("docker", "inspect", smoke.container(service)))[0]["State"]
        if not state["Running"]:
            run("docker", "start", smoke.container(service), check=False)
            return None
        if service in RUNNING_IS_ENOUGH:
            return True
        return state.get("Health", {}).get("Status", "healthy") == "healthy" or None

    smoke.wait_for(f"{service} healthy again", healthy, timeout=timeout, interval=1)
    return round(time.monotonic() - started, 1)


class Faults:
    """The seeded schedule and each fault's injection, with what each did and how long it took
    to recover."""

    def __init__(self, seed: int, proxy: FaultProxy, gaps: tuple[float, float] = (30, 90)):
        self.rng = random.Random(seed)
        self.gaps = gaps
        self.proxy = proxy
        self.queue: list[str] = []
        self.log: list[dict] = []
        self.timers: list[threading.Timer] = []

    def next_kind(self) -> str:
        if not self.queue:
            self.queue = list(KINDS)
            self.rng.shuffle(self.queue)
        return self.queue.pop()

    def gap(self) -> float:
        return self.rng.uniform(*self.gaps)

    def inject(self, kind: str, at: float) -> dict:
        event: dict = {"kind": kind, "at_s": round(at, 1)}
        started = time.monotonic()
        if kind == "pg_fast":
            # SIGINT is PostgreSQL's fast shutdown (SIGTERM, docker's stop signal, is its smart
            # one, which waits for every session to end).
            postgres = smoke.container("postgres")
            run("docker", "kill", "-s", "INT", postgres, check=False)
            run("docker", "wait", postgres, timeout=120, check=False)
            run("docker", "start", postgres, check=False)
            event["recovered_s"] = wait_service("postgres")
        elif kind == "pg_immediate":
            # Not checked: a container restarting on its own at that moment is not running.
            run("docker", "kill", smoke.container("postgres"), check=False)
            run("docker", "start", smoke.container("postgres"), check=False)
            event["recovered_s"] = wait_service("postgres")
        elif kind == "s3_restart":
            down = round(self.rng.uniform(5, 15), 1)
            self.proxy.outage = True
            time.sleep(down)
            self.proxy.outage = False
            event["down_s"] = event["recovered_s"] = down
        elif kind == "s3_errors":
            window = round(self.rng.uniform(30, 60), 1)
            self.proxy.enabled = True
            timer = threading.Timer(window, lambda: setattr(self.proxy, "enabled", False))
            timer.start()
            self.timers.append(timer)
            event["window_s"] = window
        elif kind in ("code_kill", "daemon_kill"):
            service = kind.split("_")[0]
            run("docker", "kill", smoke.container(service), check=False)
            event["recovered_s"] = wait_service(service)
        elif kind == "run_kill":
            running = [c for job in LAKE_JOBS for c in smoke.run_containers(job)]
            if not running:
                event["skipped"] = "no lake-writer run container was running"
            else:
                victim = self.rng.choice(running)
                run("docker", "kill", victim["id"], check=False)
                event["run_id"] = victim["run_id"]
        event["took_s"] = round(time.monotonic() - started, 1)
        self.log.append(event)
        say(f"fault {len(self.log)} at {at:.0f} s: {json.dumps(event)}")
        return event

    def stop(self) -> None:
        for timer in self.timers:
            timer.cancel()
        self.proxy.enabled = False
        self.proxy.outage = False


class Stream:
    """`oml-lake simulate --rate` in a container. The simulator is a test producer, not the OML
    service: it does not ride through a restart of its database, so a stream that a PostgreSQL
    fault ended is started again, with the next seed (new tenants), for the time left. Every act
    it committed stays whole (one transaction each), so a cut-off tenant's outbox is consistent."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.name = f"{smoke.PROJECT}-stream"
        self.started = 0
        self.ended_by_faults = 0

    def start(self, seconds: int) -> None:
        args = self.args
        run("docker", "rm", "-f", self.name, check=False)
        claims = max(1, args.rate * seconds // (6 * args.tenants))
        smoke.in_image(
            "oml-lake", "simulate", "--tenants", str(args.tenants), "--claims", str(claims),
            "--seed", str(args.seed + self.started), "--rate", str(args.rate),
            "--duration", str(seconds), "--bad-ratio", str(args.bad_ratio), "--no-progress",
            name=self.name, detach=True, owner=True,
        )  # fmt: skip
        self.started += 1

    def exit_code(self) -> int | None:
        """None while it runs."""
        state = json.loads(run("docker", "inspect", self.name))[0]["State"]
        return None if state["Running"] else int(state["ExitCode"])

    def keep_going(self, seconds_left: float) -> None:
        code = self.exit_code()
        if code is not None and code != 0 and seconds_left > 20:
            self.ended_by_faults += 1
            say(f"the stream ended with {code} (a fault of its database): started again")
            self.start(int(seconds_left))

    def finish(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.exit_code() is None and time.monotonic() < deadline:
            time.sleep(2)
        run("docker", "rm", "-f", self.name, check=False)


def reconciles_but_the_injected() -> bool:
    """`oml-lake reconcile`: every check passes but `no_open_dead_letters`, which the injected bad
    ops fail on purpose (they are compared with the dead letters apart, `dead-letters`)."""
    out = smoke.in_image("oml-lake", "reconcile", check=False)
    failing = [
        line.strip()
        for line in out.splitlines()
        if ": FAIL" in line and "no_open_dead_letters" not in line
    ]
    if failing or "checks pass" not in out:
        raise SmokeFailed("oml-lake reconcile: " + " | ".join(failing or out.splitlines()[:12]))
    return True


def converged() -> list[dict] | None:
    """Every tenant with ops drained through its last seq, each journal event once in bronze.
    Rows behind a gap in a tenant's journal_seq stay unsequenced (a producer killed mid-act by a
    database fault leaves the gap for good; DESIGN: a gap is waited for, never skipped): they are
    counted apart, not waited for."""
    status = [t for t in smoke.lake("status") if t["last_seq"]]
    for t in status:
        if t["drained_through"] != t["last_seq"]:
            return None
    return status


def lag_readings(name: str) -> list[dict]:
    lines = run("docker", "logs", name, check=False).splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def worst_lag(reading: dict) -> float | None:
    tenants = reading.get("tenants")
    if not tenants:
        return None
    return max(age for _pending, age, _waiting in tenants.values())


def runs_summary() -> dict:
    found = smoke.runs()
    lake = [r for r in found if r["jobName"] in LAKE_JOBS]
    by_status: dict[str, int] = {}
    for r in lake:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    retried = [r for r in found if any(t["key"] == "dagster/retry_number" for t in r["tags"])]
    return {"lake_runs": len(lake), "by_status": by_status, "relaunched_by_retry": len(retried)}


def soak(args: argparse.Namespace, proxy: FaultProxy) -> dict:
    faults = Faults(args.seed, proxy, tuple(args.gaps))
    watch = f"{smoke.PROJECT}-lagwatch"
    run("docker", "rm", "-f", watch, check=False)
    watch_seconds = args.seconds + args.recover_within + 900
    smoke.in_image(
        "python", "/smoke/smoke_lake.py", "lag-watch", str(watch_seconds), "5",
        name=watch, detach=True, owner=True,
    )  # fmt: skip
    stream = Stream(args)
    stream.start(args.seconds)
    started = time.monotonic()
    say(f"streaming {args.rate} ops/s for {args.seconds} s over {args.tenants} tenants")
    next_at = faults.gap()
    last_fault_end = started
    while True:
        now = time.monotonic() - started
        if next_at >= args.seconds:
            break
        if now < next_at:
            time.sleep(min(5.0, next_at - now))
            stream.keep_going(args.seconds - (time.monotonic() - started))
            continue
        faults.inject(faults.next_kind(), now)
        last_fault_end = time.monotonic()
        next_at = (time.monotonic() - started) + faults.gap()
    stream.finish(timeout=args.seconds - (time.monotonic() - started) + 120)
    faults.stop()
    since_last = round(last_fault_end - started, 1)
    say(f"stream ended; the last fault ended at {since_last} s")

    # The lag back under the bound, measured from the end of the last fault.
    def recovered():
        readings = [r for r in lag_readings(watch) if r["t"] >= time.time() - 30]
        worst = [worst_lag(r) for r in readings if worst_lag(r) is not None]
        return (worst and worst[-1] <= args.lag_bound) or None

    problems = []
    try:
        smoke.wait_for(
            f"every tenant's lag under {args.lag_bound} s",
            recovered,
            timeout=args.recover_within,
            interval=5,
        )
    except SmokeFailed as late:  # the other checks still say whether anything was lost
        problems.append(f"{late} of the last fault")
    status = smoke.wait_for(
        "every tenant drained, each event once in bronze",
        converged,
        timeout=args.recover_within + 900,
        interval=5,
    )
    drained_at = time.monotonic()
    readings = lag_readings(watch)
    wall_end = time.time() - (time.monotonic() - last_fault_end)
    under = [
        r["t"] - wall_end
        for r in readings
        if r["t"] >= wall_end and worst_lag(r) is not None and worst_lag(r) <= args.lag_bound
    ]
    lags = [worst_lag(r) for r in readings if worst_lag(r) is not None]
    smoke.wait_for(
        "oml-lake reconcile: every check but the injected dead letters passes",
        reconciles_but_the_injected,
        timeout=300,
        interval=10,
    )
    exact = smoke.lake("exact")
    letters = smoke.lake("dead-letters")
    result = {
        "seed": args.seed,
        "gaps_s": args.gaps,
        "stream_seconds": args.seconds,
        "rate_ops_s": args.rate,
        "tenants": len(status),
        "streams": {"started": stream.started, "ended_by_faults": stream.ended_by_faults},
        "ops": sum(t["ops"] for t in status),
        "journal_events": sum(t["journal_events"] for t in status),
        "faults": faults.log,
        "faults_by_kind": {k: sum(1 for f in faults.log if f["kind"] == k) for k in KINDS},
        "proxy": {"requests": proxy.requests, "injected": dict(proxy.injected)},
        "recovery_s": {
            k: [f["recovered_s"] for f in faults.log if f["kind"] == k and "recovered_s" in f]
            for k in KINDS
        },
        "lag_bound_s": args.lag_bound,
        "lag_max_s": max(lags) if lags else None,
        "lag_median_s": statistics.median(lags) if lags else None,
        "lag_under_bound_after_last_fault_s": round(under[0], 1) if under else None,
        "drained_after_last_fault_s": round(drained_at - last_fault_end, 1),
        "runs": runs_summary(),
        "exact": exact,
        "dead_letters": letters,
    }
    if not exact["exact"]:
        problems.append(f"lake not exact: {exact}")
    if letters["open_other"]:
        problems.append(f"dead letters not injected: {letters['other_reasons']}")
    if letters["open_injected"] != letters["injected_in_outbox"]:
        problems.append(
            f"{letters['injected_in_outbox']} bad ops injected, {letters['open_injected']} "
            "dead-lettered"
        )
    result["problems"] = problems
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=600, help="how long the stream runs")
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument("--rate", type=int, default=120, help="ops/s the producer writes")
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--bad-ratio", type=float, default=0.01)
    parser.add_argument("--lag-bound", type=float, default=60.0, help="seconds (the soak's bound)")
    parser.add_argument(
        "--recover-within", type=float, default=300.0, help="seconds after the last fault"
    )
    parser.add_argument(
        "--gaps",
        type=float,
        nargs=2,
        default=[30, 90],
        metavar=("MIN", "MAX"),
        help="seconds between faults, drawn uniformly (the short form packs them closer)",
    )
    parser.add_argument(
        "--then",
        nargs="*",
        choices=("upgrade", "restore"),
        default=[],
        help="after the soak's checks, run these drills of deploy/drills.py in the same stack",
    )
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    smoke.compose = compose  # the soak's override too, for every helper of the smoke run
    for name in ("POSTGRES_PASSWORD", "OML_WRITER_PASSWORD", "MINIO_ROOT_PASSWORD"):
        os.environ.setdefault(name, secrets.token_hex(12))
    os.environ.setdefault("OML_LAKE_SECRET_KEY", secrets.token_hex(12))
    os.environ["DOCKER_GID"] = str(os.stat("/var/run/docker.sock").st_gid)
    started = time.monotonic()
    failed = True
    result: dict = {}
    upstream = f"http://127.0.0.1:{smoke.S3_PORT}"
    proxy = FaultProxy(upstream, rate=0.1, seed=args.seed, port=int(PROXY_PORT), timeout=120)
    proxy.enabled = False
    try:
        with proxy:
            smoke.build()
            compose("down", "-v", "--remove-orphans", timeout=300)
            say(f"bringing the stack up (the lake through the fault proxy on :{PROXY_PORT})")
            compose("up", "-d", timeout=600)
            wait_stack()
            say(f"every service healthy after {time.monotonic() - started:.0f} s")
            result = soak(args, proxy)
            drills.EXTRA_FILES = [smoke.DOCKER / "compose.soak.yaml"]
            for drill in args.then:
                say(f"the {drill} drill, in the soak's stack")
                try:
                    result[drill] = drills.upgrade() if drill == "upgrade" else drills.restore()
                except SmokeFailed as exc:
                    result["problems"].append(f"the {drill} drill: {exc}")
            failed = bool(result["problems"])
    except (SmokeFailed, subprocess.TimeoutExpired) as exc:
        say(f"FAILED: {exc}")
        result["failure"] = str(exc)
    finally:
        if result:
            result["elapsed_s"] = round(time.monotonic() - started)
            text = json.dumps(result, indent=2)
            say("figures:\n" + text)
            if args.json:
                Path(args.json).write_text(text + "\n")
        for name in ("lagwatch", "stream"):
            run("docker", "rm", "-f", f"{smoke.PROJECT}-{name}", check=False)
        smoke.teardown(failed)
        if "upgrade" in args.then:
            run("docker", "rmi", drills.NEW_IMAGE, check=False)
    for problem in result.get("problems", []):
        say(f"FAILED: {problem}")
    if failed:
        return 1
    say(f"passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
