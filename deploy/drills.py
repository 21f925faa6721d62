"""Two drills in the compose stack (compose.yaml + compose.ci.yaml, loopback only), each while a
simulated workload streams, each ending with every tenant's lake checked exact against a
fault-free drain of the same outbox and `oml-lake reconcile` agreeing. deploy/drills.sh runs them
(Docker set up as deploy/smoke.sh does). deploy/README "Upgrade" and "Back up" say what they ran.

    deploy/drills.sh upgrade     the rolling upgrade
    deploy/drills.sh restore     the restore drill

upgrade: 20 s into a 150 s stream, a new image of the code location is built under a new tag
(`oml-lake:0.1.1-drill`, the checkout plus one migration the drill adds: a nullable column on
`oml.lake_dead_letter` and an index on `oml.outbox`, as a release might bring); the migration is
applied with the new image (`oml-lake db upgrade --writer-role oml_writer`, as the tables' owner)
while the stream and the drains go on; then the code server, the daemon and the webserver are
replaced one at a time by containers of the new image (`DAGSTER_CURRENT_IMAGE` names it, so every
run launched after is a container of it). Checked: nothing lost or doubled, the lag back to 0,
runs of both images succeeded, the migration recorded.

restore: a 90 s stream over new tenants; 35 s in, `pg_dump -Fc -n oml` of the lake's contract
(Dagster's run storage stays); the stream goes on and the lake drains past the dump. Then the
writers are stopped (the daemon, the run containers), schema `oml` is restored from the dump
(`pg_restore --clean --if-exists`); `oml-lake drain --tenant T` of each tenant whose lake is
ahead of the restored outbox must stop with the one line of `InconsistentFrontier` (exit 3). The documented recovery (deploy/README "Back up", "Recover a tenant's
lost prefix"): delete those tenants' prefixes, start the daemon again, one backfill of their partitions through the
webserver's GraphQL API (as the UI's), until every tenant is drained and exact; its time and the
ops re-drained give the time per million ops.

Python's standard library only, as deploy/smoke.py.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import smoke  # noqa: E402
import soak  # noqa: E402
from smoke import SmokeFailed, run, say  # noqa: E402

NEW_IMAGE = "oml-lake:0.1.1-drill"
# Compose files over compose.yaml and compose.ci.yaml (deploy/soak.py runs the drills in its
# stack, with compose.soak.yaml).
EXTRA_FILES: list[Path] = []
DRILL_MIGRATION = """-- The upgrade drill's migration (deploy/drills.py), added to a copy of the checkout only.
ALTER TABLE oml.lake_dead_letter ADD COLUMN IF NOT EXISTS drill_note text;
CREATE INDEX IF NOT EXISTS outbox_created_at_drill ON oml.outbox (created_at);
"""


def psql(sql: str) -> str:
    return run(
        "docker", "exec", smoke.container("postgres"), "psql", "-h", "/var/run/postgresql", "-p",
        smoke.PG_PORT, "-U", "oml", "-d", "oml", "-tAc", sql,
    ).strip()  # fmt: skip


def stream(seed: int, seconds: int, tenants: int = 4, rate: int = 120) -> str:
    name = f"{smoke.PROJECT}-stream"
    run("docker", "rm", "-f", name, check=False)
    claims = max(1, rate * seconds // (6 * tenants))
    smoke.in_image(
        "oml-lake", "simulate", "--tenants", str(tenants), "--claims", str(claims), "--seed",
        str(seed), "--rate", str(rate), "--duration", str(seconds), "--no-progress",
        name=name, detach=True, owner=True,
    )  # fmt: skip
    return name


def converged_exact() -> dict:
    """Every tenant with ops drained and each event once in bronze, reconcile agreeing, and the
    lake equal to a fault-free drain of the same outbox."""
    status = smoke.wait_for(
        "every tenant drained, each event once in bronze",
        lambda: smoke.drained([t for t in smoke.lake("status") if t["ops"]], 1),
        timeout=600,
        interval=5,
    )
    smoke.wait_for(
        "oml-lake reconcile: every check but the injected dead letters passes",
        soak.reconciles_but_the_injected,
        timeout=300,
        interval=10,
    )
    exact = smoke.lake("exact")
    if not exact["exact"]:
        raise SmokeFailed(f"the lake is not exact: {exact}")
    return {"tenants": len(status), "ops": sum(t["ops"] for t in status), "exact": exact}


# --- the rolling upgrade -----------------------------------------------------------------------


def build_new_image() -> float:
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as context:
        root = Path(context)
        for part in ("pyproject.toml", "README.md", "dagster.yaml", "deploy/docker"):
            source = smoke.REPO / part
            target = root / part
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target)
            else:
                shutil.copy(source, target)
        shutil.copytree(
            smoke.REPO / "oml_dagster",
            root / "oml_dagster",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        migrations = root / "oml_dagster" / "lake" / "migrations"
        number = max(int(p.name[:4]) for p in migrations.glob("[0-9][0-9][0-9][0-9]_*.sql")) + 1
        (migrations / f"{number:04d}_upgrade_drill.sql").write_text(DRILL_MIGRATION)
        run(
            "docker", "build", "-q", "--network", "host", "-f", "deploy/docker/Dockerfile",
            "--build-arg", "BASE_IMAGE=local/debian-ci:bookworm", "-t", NEW_IMAGE, context,
            timeout=1500,
        )  # fmt: skip
    return round(time.monotonic() - started, 1)


def replace_with_new_image(override: Path) -> dict:
    """Each long-running service of the code image, one at a time, recreated from the new
    image and waited for: the code server first (the runs it reports start from its image)."""
    override.write_text(
        "services:\n"
        f"  code:\n    image: {NEW_IMAGE}\n"
        f"    environment:\n      DAGSTER_CURRENT_IMAGE: {NEW_IMAGE}\n"
        f"  daemon:\n    image: {NEW_IMAGE}\n"
        f"  webserver:\n    image: {NEW_IMAGE}\n"
    )
    files = [
        "-f", str(smoke.DOCKER / "compose.yaml"),
        "-f", str(smoke.DOCKER / "compose.ci.yaml"),
        *[arg for extra in EXTRA_FILES for arg in ("-f", str(extra))],
        "-f", str(override),
    ]  # fmt: skip
    took = {}
    for service in ("code", "daemon", "webserver"):
        started = time.monotonic()
        run("docker-compose", "-p", smoke.PROJECT, *files, "up", "-d", "--no-deps", service,
            timeout=600)  # fmt: skip
        soak.wait_service(service, timeout=600)
        took[service] = round(time.monotonic() - started, 1)
        say(f"{service}: replaced by {NEW_IMAGE} in {took[service]} s")
    return took


def upgrade() -> dict:
    name = stream(41, 150)
    started = time.monotonic()
    time.sleep(20)
    say(f"building {NEW_IMAGE} (the checkout plus the drill's migration) while streaming")
    built_s = build_new_image()
    say(f"built in {built_s} s; applying its migration while streaming")
    migrated = run(
        "docker", "run", "--rm", "--network", "host", "--init",
        "-e", f"OML_PG_DSN=postgresql://oml:{os.environ['POSTGRES_PASSWORD']}@127.0.0.1:"
              f"{smoke.PG_PORT}/oml",
        "-e", f"OML_WRITER_PASSWORD={os.environ['OML_WRITER_PASSWORD']}",
        NEW_IMAGE, "oml-lake", "db", "upgrade", "--writer-role", "oml_writer",
    )  # fmt: skip
    say("migration: " + " | ".join(migrated.strip().splitlines()))
    override = Path(tempfile.mkdtemp(prefix="oml-drill-")) / "compose.upgrade.yaml"
    replaced = replace_with_new_image(override)
    switched = time.time()
    smoke.end_stream(name, 300)
    result = converged_exact()
    result["converged_after_stream_s"] = round(time.monotonic() - started - 150, 1)
    versions = psql("SELECT string_agg(version::text || ' ' || name, ', ' ORDER BY version)"
                    " FROM oml.schema_migrations")  # fmt: skip
    if "upgrade_drill" not in versions:
        raise SmokeFailed(f"the drill's migration is not recorded: {versions}")
    images: dict[str, dict[str, int]] = {}
    for r in smoke.runs():
        if r["jobName"] not in ("lake_writer_shard_job", "lake_writer_job"):
            continue
        image = next((t["value"] for t in r["tags"] if t["key"] == "dagster/image"), "?")
        images.setdefault(image, {}).setdefault(r["status"], 0)
        images[image][r["status"]] += 1
    if not images.get(NEW_IMAGE, {}).get("SUCCESS"):
        raise SmokeFailed(f"no lake run of {NEW_IMAGE} succeeded: {images}")
    result.update(
        new_image=NEW_IMAGE,
        build_s=built_s,
        replaced_s=replaced,
        migrations=versions,
        lake_runs_by_image=images,
        switched_at=switched,
    )
    return result


# --- the restore drill -------------------------------------------------------------------------


def dumped_outbox_rows(dump: str) -> int:
    """The outbox rows the dump holds, read from the dump itself: a count taken beside
    `pg_dump` sees the rows the stream committed after the dump's snapshot."""
    script = run("docker", "exec", smoke.container("postgres"), "pg_restore", "--data-only",
                 "-n", "oml", "-t", "outbox", "-f", "-", dump)  # fmt: skip
    lines = iter(script.splitlines())
    for line in lines:
        if line.startswith("COPY oml.outbox "):
            break
    else:
        raise SmokeFailed(f"{dump} holds no data of oml.outbox")
    for count, line in enumerate(lines):
        if line == "\\.":
            return count
    raise SmokeFailed(f"{dump}: oml.outbox's data does not end")


def restore() -> dict:
    name = stream(51, 90)
    time.sleep(35)
    dump_at = time.time()
    run("docker", "exec", smoke.container("postgres"), "pg_dump", "-h", "/var/run/postgresql", "-p",
        smoke.PG_PORT, "-U", "oml", "-d", "oml", "-n", "oml", "-Fc", "-f", "/tmp/oml.dump")  # fmt: skip
    at_dump = dumped_outbox_rows("/tmp/oml.dump")
    say(f"pg_dump of schema oml taken with {at_dump} outbox rows; the stream and drains go on")
    smoke.end_stream(name, 300)
    before = smoke.wait_for(
        "every tenant drained past the dump",
        lambda: smoke.drained([t for t in smoke.lake("status") if t["ops"]], 1),
        timeout=600,
        interval=5,
    )
    ops_before = sum(t["ops"] for t in before)
    say(f"drained {ops_before} ops ({ops_before - at_dump} after the dump); restoring the dump")
    # The writers stopped for the restore: the daemon (no new runs), the run containers.
    run("docker", "stop", "-t", "10", smoke.container("daemon"))
    for c in smoke.run_containers():
        run("docker", "kill", c["id"], check=False)
    psql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = 'oml_writer'"
    )
    restored_at = time.monotonic()
    run("docker", "exec", smoke.container("postgres"), "pg_restore", "-h", "/var/run/postgresql", "-p",
        smoke.PG_PORT, "-U", "oml", "-d", "oml", "--clean", "--if-exists", "-n", "oml",
        "/tmp/oml.dump")  # fmt: skip
    after = int(psql("SELECT count(*) FROM oml.outbox"))
    if after != at_dump:
        raise SmokeFailed(f"the restored outbox holds {after} rows, the dump {at_dump}")
    # Where the lake is ahead of the restored outbox, the writer must stop with its one line.
    status = [t for t in smoke.lake("status") if t["ops"]]
    tenants = [t["tenant"] for t in status]
    ahead = [t["tenant"] for t in status if t["drained_through"] > t["last_seq"]]
    if not ahead:
        raise SmokeFailed(
            "no tenant's lake is ahead of the restored outbox: the drill drilled nothing"
        )
    affected, lines = [], {}
    for tenant_id in ahead:
        done = subprocess.run(
            ["docker", "run", "--rm", "--network", "host", "--init", *smoke.lake_env(),
             smoke.IMAGE, "oml-lake", "drain", "--tenant", tenant_id],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        err = done.stderr.strip().splitlines()
        lines[tenant_id] = (done.returncode, err[-1] if err else "")
        if done.returncode != 3 or len(err) != 1 or "InconsistentFrontier" not in err[0]:
            raise SmokeFailed(f"tenant {tenant_id} ahead of the restore: drain exited "
                              f"{done.returncode}: {done.stderr[-800:]}")  # fmt: skip
        affected.append(tenant_id)
    say(f"{len(affected)} of {len(tenants)} tenants stop with one line, e.g. "
        f"{next(iter(lines.values()))[1]}")  # fmt: skip
    # The documented recovery: delete their prefixes, backfill their partitions.
    recovery = time.monotonic()
    for tenant_id in affected:
        gone = smoke.lake("delete-prefix", tenant_id)
        if gone["left"]:
            raise SmokeFailed(f"deleting {tenant_id}'s prefix left {gone['left']} objects")
    run("docker", "start", smoke.container("daemon"))
    params = {
        "partitionNames": affected,
        "assetSelection": [{"path": path} for path in smoke.LAKE_ASSETS],
        "fromFailure": False,
    }
    launched = smoke.graphql(smoke.BACKFILL, params=params)["launchPartitionBackfill"]
    if launched["__typename"] != "LaunchBackfillSuccess":
        raise SmokeFailed(f"launchPartitionBackfill: {launched}")
    result = converged_exact()
    recovered_s = time.monotonic() - recovery
    redrained = sum(t["ops"] for t in smoke.lake("status") if t["tenant"] in affected)
    return {
        "ops_at_dump": at_dump,
        "ops_drained_before_restore": ops_before,
        "tenants": len(tenants),
        "affected": len(affected),
        "inconsistent_frontier_line": next(iter(lines.values()))[1],
        "restore_s": round(recovery - restored_at, 1),
        "recovery_s": round(recovered_s, 1),
        "ops_redrained": redrained,
        "seconds_per_million_ops": round(recovered_s / max(redrained, 1) * 1e6),
        "backfill": launched["backfillId"],
        **result,
        "dump_at": dump_at,
    }


def main(argv: list[str]) -> int:
    if argv not in (["upgrade"], ["restore"]):
        print(__doc__, file=sys.stderr)
        return 2
    for secret in ("POSTGRES_PASSWORD", "OML_WRITER_PASSWORD", "MINIO_ROOT_PASSWORD"):
        os.environ.setdefault(secret, secrets.token_hex(12))
    os.environ.setdefault("OML_LAKE_SECRET_KEY", secrets.token_hex(12))
    os.environ["DOCKER_GID"] = str(os.stat("/var/run/docker.sock").st_gid)
    started = time.monotonic()
    failed, result = True, {}
    try:
        smoke.build()
        smoke.compose("down", "-v", "--remove-orphans", timeout=300)
        smoke.compose("up", "-d", timeout=600)
        soak.wait_stack()
        say(f"every service healthy after {time.monotonic() - started:.0f} s; the {argv[0]} drill")
        result = upgrade() if argv == ["upgrade"] else restore()
        failed = False
    except (SmokeFailed, subprocess.TimeoutExpired) as exc:
        say(f"FAILED: {exc}")
    finally:
        run("docker", "rm", "-f", f"{smoke.PROJECT}-stream", check=False)
        smoke.teardown(failed)
        if argv == ["upgrade"]:
            run("docker", "rmi", NEW_IMAGE, check=False)
    if result:
        say(f"{argv[0]} drill figures:\n" + json.dumps(result, indent=2))
    if failed:
        return 1
    say(f"the {argv[0]} drill passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
