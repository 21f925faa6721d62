"""The compose deployment, run for real (deploy/smoke.sh starts Docker and the base image first).

Steps, each bounded in time, each failing with its reason:
  1. build the CI base (the machine's CA certificates on local/debian:bookworm) and every image;
  2. bring the stack up (compose.yaml + compose.ci.yaml) and wait until every service is healthy;
  3. stream a simulated workload for several tenants into the outbox, then wait until every
     tenant's lake on S3 holds everything sequenced, each journal event exactly once, and
     `oml-lake reconcile` exits 0 (run inside the code image); the webserver's GraphQL API must
     show succeeded lake runs and every tenant as a partition of each lake asset;
     Prometheus (scraping `oml-lake exporter`) must hold every tenant's lag series;
  4. stream a second workload (new tenants); mid-stream, kill the daemon container and a running
     lake-writer run container, wait until Prometheus's stuck-tenant alert is pending or firing
     (the CI rules shorten its ten minutes to 20 s), then start the daemon again; check all of 3
     again, that the killed run is marked failed and that the alert resolved;
  5. delete one tenant's lake prefix, launch a backfill of its partition of the lake assets
     through the GraphQL API (as the UI's "Materialize selected" does), and check the rebuilt lake
     reconciles and holds the same rows as before;
  6. tear everything down, volumes and run containers too (OML_SMOKE_KEEP=1 keeps the stack).

Python's standard library only: it runs on the machine's python3, outside every image.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCKER = REPO / "deploy" / "docker"
PROJECT = os.environ.get("OML_SMOKE_PROJECT", "oml-smoke")
IMAGE = "oml-lake:0.1.0"
PG_PORT = os.environ.setdefault("OML_SMOKE_PG_PORT", "15432")
S3_PORT = os.environ.setdefault("OML_SMOKE_S3_PORT", "19000")
UI_PORT = os.environ.setdefault("OML_SMOKE_UI_PORT", "13000")
PROM_PORT = os.environ.setdefault("OML_SMOKE_PROM_PORT", "19090")
SERVICES = ("postgres", "minio", "code", "webserver", "daemon", "exporter", "prometheus")
STUCK = "OmlLakeTenantStuck"
ONE_SHOT = ("migrate", "minio-init")
LAKE_ASSETS = (
    ["bronze", "events"],
    ["silver", "claims"],
    ["gold", "lineage"],
    ["gold", "areas"],
    ["gold", "curated"],
)
TENANTS = int(os.environ.get("OML_SMOKE_TENANTS", "4"))
FIRST_STREAM_SECONDS = 30
STREAM_SECONDS = int(os.environ.get("OML_SMOKE_STREAM_SECONDS", "60"))
STREAM_RATE = int(os.environ.get("OML_SMOKE_RATE", "120"))
KILL_AFTER = 25  # seconds into the stream


class SmokeFailed(Exception):
    pass


def say(message: str) -> None:
    print(f"smoke: {message}", file=sys.stderr, flush=True)


def run(*cmd: str, check: bool = True, timeout: float = 600, quiet: bool = False) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
        raise SmokeFailed(
            f"`{' '.join(cmd[:6])} ...` exited {done.returncode}:\n" + "\n".join(tail)
        )
    if not quiet and done.stderr.strip() and done.returncode != 0:
        say(done.stderr.strip())
    return done.stdout


def wait_for(what: str, probe, *, timeout: float, interval: float = 3.0):
    """Call probe() until it returns something true; fail naming `what` and the last reason."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            found = probe()
            if found:
                return found
        except SmokeFailed as exc:
            last = str(exc)
        if time.monotonic() > deadline:
            raise SmokeFailed(
                f"{what}: not within {timeout:.0f} s" + (f" ({last})" if last else "")
            )
        time.sleep(interval)


# --- the stack ---------------------------------------------------------------------------------


def compose(*args: str, timeout: float = 900) -> str:
    files = ["-f", str(DOCKER / "compose.yaml"), "-f", str(DOCKER / "compose.ci.yaml")]
    return run("docker-compose", "-p", PROJECT, *files, *args, timeout=timeout)


def container(service: str) -> str:
    ids = compose("ps", "-q", service).split()
    if not ids:
        raise SmokeFailed(f"service {service} has no container")
    return ids[0]


def health(service: str) -> str:
    state = json.loads(run("docker", "inspect", container(service)))[0]["State"]
    return state.get("Health", {}).get("Status") or state["Status"]


def lake_env(owner: bool = False) -> list[str]:
    """The lake's settings for a command in the image: the writer's login role (row-level
    security, ADR 0049), or with `owner` the tables' owner (the producer, the smoke's probes)."""
    user, password = (
        ("oml", "POSTGRES_PASSWORD") if owner else ("oml_writer", "OML_WRITER_PASSWORD")
    )
    env = {
        "OML_PG_DSN": f"postgresql://{user}:{os.environ[password]}@127.0.0.1:{PG_PORT}/oml",
        "OML_LAKE_URI": "s3://oml-lake/oml-lake",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{S3_PORT}",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "oml-lake-writer",
        "AWS_SECRET_ACCESS_KEY": os.environ["OML_LAKE_SECRET_KEY"],
    }
    return [arg for k, v in env.items() for arg in ("-e", f"{k}={v}")]


def in_image(
    *cmd: str,
    check: bool = True,
    name: str | None = None,
    detach: bool = False,
    owner: bool = False,
) -> str:
    """A command in the code location image, on the host's network, with the lake's settings
    (`owner`: as the tables' owner, see lake_env)."""
    extra = ["--name", name] if name else []
    extra += ["-d"] if detach else ["--rm"]
    mount = f"{REPO / 'deploy' / 'smoke_lake.py'}:/smoke/smoke_lake.py:ro"
    return run(
        "docker", "run", *extra, "--network", "host", "--init", *lake_env(owner), "-v", mount,
        IMAGE,
        *cmd, check=check,
    )  # fmt: skip


def lake(*args: str):
    return json.loads(in_image("python", "/smoke/smoke_lake.py", *args, owner=True))


def run_containers(job: str | None = None, *, running: bool = True) -> list[dict]:
    """Containers the DockerRunLauncher started (not part of the compose project)."""
    filters = ["--filter", "label=dagster/run_id"]
    if job:
        filters += ["--filter", f"label=dagster/job_name={job}"]
    listed = run("docker", "ps", *([] if running else ["-a"]), "-q", *filters).split()
    return [
        {"id": c["Id"], "run_id": c["Config"]["Labels"]["dagster/run_id"]}
        for c in (json.loads(run("docker", "inspect", *listed)) if listed else [])
    ]


# --- the webserver's GraphQL API ---------------------------------------------------------------


def graphql(query: str, **variables) -> dict:
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{UI_PORT}/graphql",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.load(response)
    except (urllib.error.URLError, OSError) as exc:
        raise SmokeFailed(f"GraphQL: {exc}") from exc
    if answer.get("errors"):
        raise SmokeFailed(f"GraphQL: {answer['errors'][0].get('message')}")
    return answer["data"]


RUNS = """query { runsOrError(filter: {}) { __typename
  ... on Runs { results { runId jobName status tags { key value } } }
  ... on PythonError { message } } }"""

PARTITIONS = """query($path: [String!]!) { assetNodeOrError(assetKey: {path: $path}) { __typename
  ... on AssetNode { partitionKeys assetPartitionStatuses { __typename
    ... on DefaultPartitionStatuses { materializedPartitions failedPartitions } } } } }"""

BACKFILL = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params)
  { __typename ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message } ... on InvalidSubsetError { message }
    ... on UnauthorizedError { message } } }"""

BACKFILL_STATUS = """query($id: String!) { partitionBackfillOrError(backfillId: $id) { __typename
  ... on PartitionBackfill { status } ... on PythonError { message } } }"""


def runs() -> list[dict]:
    found = graphql(RUNS)["runsOrError"]
    if found["__typename"] != "Runs":
        raise SmokeFailed(f"GraphQL runs: {found.get('message')}")
    return found["results"]


def partitions(path: list[str]) -> tuple[set[str], set[str]]:
    node = graphql(PARTITIONS, path=path)["assetNodeOrError"]
    if node["__typename"] != "AssetNode":
        raise SmokeFailed(f"GraphQL: no asset {'/'.join(path)}")
    statuses = node["assetPartitionStatuses"]
    return set(node["partitionKeys"]), set(statuses.get("materializedPartitions") or [])


# --- Prometheus's HTTP API -------------------------------------------------------------------


def prometheus(path: str, **params: str) -> list:
    query = urllib.parse.urlencode(params)
    url = f"http://127.0.0.1:{PROM_PORT}/api/v1/{path}" + (f"?{query}" if query else "")
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            answer = json.load(response)
    except (urllib.error.URLError, OSError) as exc:
        raise SmokeFailed(f"Prometheus: {exc}") from exc
    if answer.get("status") != "success":
        raise SmokeFailed(f"Prometheus: {answer}")
    data = answer["data"]
    return data["alerts"] if path == "alerts" else data["result"]


def lag_series_in_prometheus(tenants: list[str]) -> None:
    def every_tenant():
        found = {
            r["metric"].get("tenant")
            for r in prometheus("query", query="oml_lake_tenant_drain_lag_seconds")
        }
        missing = sorted(set(tenants) - found)
        if missing:
            raise SmokeFailed(f"no lag series in Prometheus for {missing}")
        return True

    wait_for("Prometheus holds every tenant's lag series", every_tenant, timeout=120, interval=5)
    say(f"Prometheus holds the lag series of all {len(tenants)} tenants")


def stuck_alerts() -> list[dict]:
    return [a for a in prometheus("alerts") if a["labels"].get("alertname") == STUCK]


# --- the checks --------------------------------------------------------------------------------


def drained(status: list[dict], tenants: int) -> list[dict] | None:
    """Every tenant drained through its last seq, each journal event once in bronze."""
    if len(status) < tenants:
        return None
    for t in status:
        if t["unsequenced"] or t["drained_through"] != t["last_seq"] or t["last_seq"] == 0:
            return None
        if not t["bronze_rows"] == t["bronze_distinct"] == t["journal_events"]:
            raise SmokeFailed(f"tenant {t['tenant']}: bronze does not hold each event once: {t}")
    return status


def reconciles(*tenant: str) -> bool:
    args = [a for t in tenant for a in ("--tenant", t)]
    out = in_image("oml-lake", "reconcile", *args, check=False)
    if "FINDINGS" in out or "agrees" not in out:
        raise SmokeFailed("oml-lake reconcile: " + " | ".join(out.strip().splitlines()[:12]))
    return True


def wait_healthy(timeout: float = 240) -> None:
    def all_healthy():
        states = {s: health(s) for s in SERVICES}
        for s, state in states.items():
            if state in ("unhealthy", "exited", "dead"):
                logs = run("docker", "logs", "--tail", "20", container(s), check=False)
                raise SmokeFailed(f"service {s} is {state}:\n{logs}")
        if all(state == "healthy" for state in states.values()):
            return states
        raise SmokeFailed(f"not healthy yet: {states}")

    wait_for("every service healthy", all_healthy, timeout=timeout)
    for s in ONE_SHOT:
        code = json.loads(run("docker", "inspect", container(s)))[0]["State"]["ExitCode"]
        if code != 0:
            raise SmokeFailed(f"{s} exited {code}: {run('docker', 'logs', container(s))[-2000:]}")


def start_stream(seed: int, seconds: int) -> tuple[str, float]:
    """`oml-lake simulate` streaming new tenants' workloads into the outbox, in the background."""
    name = f"{PROJECT}-stream"
    run("docker", "rm", "-f", name, check=False)
    claims = STREAM_RATE * seconds // (6 * TENANTS)  # about 6.7 ops a claim: it lasts `seconds`
    in_image(
        "oml-lake", "simulate", "--tenants", str(TENANTS), "--claims", str(claims),
        "--seed", str(seed), "--rate", str(STREAM_RATE), "--duration", str(seconds),
        "--no-progress", name=name, detach=True, owner=True,
    )  # fmt: skip
    return name, time.monotonic()


def end_stream(name: str, seconds: int) -> None:
    code = run("docker", "wait", name, timeout=seconds + 300).strip()
    logs = run("docker", "logs", name, check=False)
    run("docker", "rm", "-f", name, check=False)
    if code != "0":
        raise SmokeFailed(f"the workload stream exited {code}:\n{logs[-2000:]}")
    say("stream done: " + " | ".join(line.strip() for line in logs.strip().splitlines()[:2]))


def stream_with_kills(seed: int, seconds: int) -> str:
    """Stream a workload; mid-stream kill the daemon and one lake run container, restart the
    daemon. Returns the killed run's id."""
    name, started = start_stream(seed, seconds)
    lake_jobs = ("lake_writer_shard_job", "lake_writer_job")
    victim = wait_for(
        "a lake-writer run container draining the stream",
        lambda: [c for job in lake_jobs for c in run_containers(job)],
        timeout=120,
    )[0]
    # The run container got its settings: the secrets from the launcher, the code location's
    # settings through its container context.
    env = json.loads(run("docker", "inspect", victim["id"]))[0]["Config"]["Env"]
    for needed in ("OML_SHARD_RUN_SECONDS=45", "OML_MAX_BATCH=5000", "AWS_SECRET_ACCESS_KEY="):
        if not any(e.startswith(needed) for e in env):
            raise SmokeFailed(f"run container {victim['id'][:12]} lacks {needed}")
    time.sleep(max(0.0, KILL_AFTER - (time.monotonic() - started)))
    # The run found first may have ended meanwhile (a shard run's time is up): kill one that runs.
    running = [c for job in lake_jobs for c in run_containers(job)]
    if victim not in running:
        if not running:
            raise SmokeFailed("no lake-writer run container is running to kill")
        victim = running[0]
    say(f"killing the daemon and run container {victim['id'][:12]} (run {victim['run_id']})")
    run("docker", "kill", container("daemon"))
    run("docker", "kill", victim["id"])
    time.sleep(10)
    # Nothing drains the killed run's tenants now, and nothing cuts once the other shard runs
    # end: the stuck-tenant alert must come (pending, then firing).
    alerts = wait_for(
        f"the {STUCK} alert pending or firing while the daemon is down",
        lambda: [a for a in stuck_alerts() if a["state"] in ("pending", "firing")],
        timeout=180,
        interval=5,
    )
    say(
        f"{STUCK}: {len(alerts)} tenants "
        f"({', '.join(sorted({a['state'] for a in alerts}))}) with the daemon down"
    )
    say("starting the daemon again")
    run("docker", "start", container("daemon"))
    end_stream(name, seconds)
    return victim["run_id"]


def stuck_resolved() -> None:
    def none_active():
        active = stuck_alerts()
        if active:
            raise SmokeFailed(f"{STUCK} still {[a['state'] for a in active]}")
        return True

    wait_for(f"the {STUCK} alert resolved", none_active, timeout=180, interval=5)
    say(f"{STUCK}: resolved with every tenant drained")


def converged(tenants: int) -> list[str]:
    """Wait until every tenant is drained, each event once in bronze, and reconcile agrees."""
    status = wait_for(
        "every tenant drained, each event once in bronze",
        lambda: drained(lake("status"), tenants),
        timeout=420,
        interval=5,
    )
    wait_for("oml-lake reconcile exits 0", reconciles, timeout=120, interval=5)
    events = sum(t["journal_events"] for t in status)
    say(f"{len(status)} tenants drained and reconciled: {events} journal events, once each")
    return [t["tenant"] for t in status]


def check_dagster_view(tenants: list[str], killed_run: str | None = None) -> None:
    def killed_run_failed():
        (found,) = [r for r in runs() if r["runId"] == killed_run] or [None]
        if found and found["status"] in ("FAILURE", "CANCELED"):
            return found
        raise SmokeFailed(f"the killed run is {found and found['status']}")

    if killed_run:
        # Run monitoring polls every 60 s (dagster.yaml) before it fails a run whose container
        # died.
        wait_for("the killed run marked failed", killed_run_failed, timeout=240, interval=5)

    def lake_runs_succeeded():
        done = [
            r
            for r in runs()
            if r["jobName"] in ("lake_writer_shard_job", "lake_writer_job")
            and r["status"] == "SUCCESS"
        ]
        return done or None

    done = wait_for("a succeeded lake-writer run", lake_runs_succeeded, timeout=240, interval=5)
    # Every tenant is a partition of each lake asset; every batch appends to bronze, so each
    # tenant is materialized there (the other tables only where its batches changed them).
    for path in LAKE_ASSETS:

        def every_tenant(path=path):
            keys, materialized = partitions(path)
            if set(tenants) - keys:
                raise SmokeFailed(
                    f"{'/'.join(path)}: not partitions: {sorted(set(tenants) - keys)}"
                )
            if path == ["bronze", "events"] and set(tenants) - materialized:
                missing = sorted(set(tenants) - materialized)
                raise SmokeFailed(f"bronze/events: tenants not materialized: {missing}")
            return True

        wait_for(f"every tenant a partition of {'/'.join(path)}", every_tenant, timeout=120)
    killed = ", the killed run failed" if killed_run else ""
    say(f"GraphQL: {len(done)} lake runs succeeded{killed}, {len(tenants)} tenants partitions")


def backfill_lost_tenant(tenant_id: str) -> None:
    before = lake("fingerprint", tenant_id)
    gone = lake("delete-prefix", tenant_id)
    if gone["deleted"] == 0 or gone["left"] != 0:
        raise SmokeFailed(f"deleting the tenant's prefix: {gone}")
    say(f"deleted {gone['deleted']} objects under s3://{gone['bucket']}/{gone['prefix']}")
    if lake("fingerprint", tenant_id):
        raise SmokeFailed("the tenant's tables are still there after deleting the prefix")
    params = {
        "partitionNames": [tenant_id],
        "assetSelection": [{"path": path} for path in LAKE_ASSETS],
        "fromFailure": False,
    }
    launched = graphql(BACKFILL, params=params)["launchPartitionBackfill"]
    if launched["__typename"] != "LaunchBackfillSuccess":
        raise SmokeFailed(f"launchPartitionBackfill: {launched}")
    backfill_id = launched["backfillId"]
    say(f"backfill {backfill_id} launched for tenant {tenant_id}")

    def completed():
        status = graphql(BACKFILL_STATUS, id=backfill_id)["partitionBackfillOrError"]
        state = status.get("status")
        if state in ("FAILED", "CANCELED", "COMPLETED_FAILED"):
            raise SmokeFailed(f"backfill {backfill_id} ended {state}")
        return state in ("COMPLETED", "COMPLETED_SUCCESS")

    try:
        wait_for("the backfill completed", completed, timeout=300, interval=5)
    except SmokeFailed as exc:
        if "ended" in str(exc):
            raise
        raise SmokeFailed(f"{exc}") from exc
    after = lake("fingerprint", tenant_id)
    if after != before:
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        raise SmokeFailed(f"the rebuilt lake differs from the lost one in {changed}")
    reconciles(tenant_id)
    say(f"tenant {tenant_id}: rebuilt by the backfill, {len(after)} tables, rows as before")


def teardown(failed: bool) -> None:
    if failed:
        log = Path(tempfile.gettempdir()) / f"{PROJECT}-compose.log"
        try:
            log.write_text(compose("logs", "--no-color", "--tail", "300", timeout=120))
            say(f"the services' logs: {log}")
        except (SmokeFailed, subprocess.TimeoutExpired):
            pass
    if os.environ.get("OML_SMOKE_KEEP") == "1":
        say(f"kept: docker-compose -p {PROJECT} -f {DOCKER}/compose.yaml "
            f"-f {DOCKER}/compose.ci.yaml down -v")  # fmt: skip
        return
    say("tearing down (containers, run containers, volumes)")
    compose("down", "-v", "--remove-orphans", "--timeout", "10", timeout=300)
    leftover = [c["id"] for c in run_containers(running=False)]
    if leftover:
        run("docker", "rm", "-f", *leftover, check=False)
    run("docker", "rm", "-f", f"{PROJECT}-stream", check=False)


def build() -> None:
    with tempfile.TemporaryDirectory() as context:
        shutil.copy(DOCKER / "ci" / "base.Dockerfile", Path(context) / "Dockerfile")
        certs = list(Path("/usr/local/share/ca-certificates").glob("**/*.crt"))
        for cert in certs:
            shutil.copy(cert, Path(context) / cert.name)
        if not certs:  # the COPY needs one file; an empty one adds nothing
            (Path(context) / "none.crt").write_text("")
        say(f"building the CI base image ({len(certs)} extra CA certificates)")
        run("docker", "build", "-q", "--network", "host", "-t", "local/debian-ci:bookworm", context)
    say("building the images (code location, PostgreSQL, moto, Prometheus)")
    compose("build", timeout=1500)


def main() -> int:
    os.environ.setdefault("POSTGRES_PASSWORD", secrets.token_hex(12))
    os.environ.setdefault("OML_WRITER_PASSWORD", secrets.token_hex(12))
    os.environ.setdefault("MINIO_ROOT_PASSWORD", secrets.token_hex(12))
    os.environ.setdefault("OML_LAKE_SECRET_KEY", secrets.token_hex(12))
    os.environ["DOCKER_GID"] = str(os.stat("/var/run/docker.sock").st_gid)
    started = time.monotonic()
    failed = True
    try:
        build()
        compose("down", "-v", "--remove-orphans", timeout=300)  # a previous run's leftovers
        say("bringing the stack up")
        compose("up", "-d", timeout=600)
        wait_healthy()
        say(f"every service healthy after {time.monotonic() - started:.0f} s")
        # The deployed workspace (over gRPC, with the image's instance) validates.
        run("docker", "exec", container("webserver"), "dagster", "definitions", "validate",
            "-w", "/opt/dagster/app/workspace.yaml")  # fmt: skip
        say("dagster definitions validate: the deployed workspace loads")
        say("streaming the first workload")
        end_stream(*start_stream(7, FIRST_STREAM_SECONDS)[:1], FIRST_STREAM_SECONDS)
        tenants = converged(TENANTS)
        check_dagster_view(tenants)
        lag_series_in_prometheus(tenants)
        say("streaming the second workload, killing the daemon and a run container mid-stream")
        killed = stream_with_kills(8, STREAM_SECONDS)
        tenants = converged(2 * TENANTS)
        check_dagster_view(tenants, killed)
        stuck_resolved()
        backfill_lost_tenant(tenants[0])
        failed = False
    except (SmokeFailed, subprocess.TimeoutExpired) as exc:
        say(f"FAILED: {exc}")
    finally:
        teardown(failed)
    if failed:
        return 1
    say(f"passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
