"""Helpers for the Dagster tests: a small workload touching every table, comparing two lakes,
Dagster instances on a fresh Postgres database, and subprocesses that are always stopped."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME
from oml_dagster.lake.model.tables import TableId
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import tenant_tables
from oml_dagster.simulate import acts, producer

from .conftest import ADMIN_DSN
from .helpers import lake_snapshot  # noqa: F401  (the Dagster tests import it from here)

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# Columns a drain stamps with its own clock: two drains of the same ops differ there only.


@dataclass
class Workload:
    """What `seed_tenant` wrote for one tenant."""

    keys: producer.TenantKeys
    areas: list[str] = field(default_factory=list)
    claims: list[acts.Claim] = field(default_factory=list)
    edges: list[acts.Edge] = field(default_factory=list)
    bad_ops: int = 0

    @property
    def tenant_id(self) -> str:
        return self.keys.tenant_id


def seed_tenant(
    conn: psycopg.Connection,
    keys: producer.TenantKeys | None = None,
    *,
    claims: int = 4,
    bad: bool = True,
) -> Workload:
    """Acts that reach all five tables: areas, promotions, an edge, a demote, an erase, a
    validation (a curated table), a retract after it, and one self-signed promotion the writer
    refuses (a dead letter)."""
    keys = keys or producer.create_tenant(conn)
    work = Workload(keys)
    root, child = str(uuid.uuid4()), str(uuid.uuid4())
    acts.upsert_area(conn, keys, root, path="root", status="development")
    acts.upsert_area(conn, keys, child, parent_id=root, path="root.child", status="development")
    work.areas = [root, child]
    for i in range(max(claims, 4)):
        claim = acts.Claim(str(uuid.uuid4()), 1, child, "root.child")
        acts.promote(conn, keys, claim, f"body {i}".encode())
        work.claims.append(claim)
    edge = acts.Edge(str(uuid.uuid4()), work.claims[0].artifact_id, work.claims[1].artifact_id)
    acts.ratify(conn, keys, edge)
    work.edges.append(edge)
    acts.demote(conn, keys, work.claims[2])
    acts.erase(conn, keys, work.claims[3])
    acts.upsert_area(conn, keys, child, status="committed")
    acts.validate_area(conn, keys, child)
    acts.demote(conn, keys, work.claims[1])
    if bad:
        refused = acts.Claim(str(uuid.uuid4()), 1, child, "root.child")
        acts.promote(conn, keys, refused, b"never", self_signed=True)
        work.bad_ops = 1
    return work


def more_acts(conn: psycopg.Connection, work: Workload, n: int = 2) -> None:
    """A few more promotions for a tenant already seeded."""
    for i in range(n):
        claim = acts.Claim(str(uuid.uuid4()), 1, work.areas[0], "root")
        acts.promote(conn, work.keys, claim, f"more {i}".encode())
        work.claims.append(claim)


def table_versions(lake: Lake, tenant_id: str) -> dict[TableId, int]:
    return {t.table: lake.open(t.uri).version() for t in tenant_tables(lake, tenant_id)}


def delete_tenant_prefix(lake: Lake, tenant_id: str) -> None:
    shutil.rmtree(lake.tenant_uri(tenant_id))


# --- Postgres databases and Dagster homes --------------------------------------------------------


@contextlib.contextmanager
def fresh_database(prefix: str = "oml_dagster") -> Iterator[dict[str, str]]:
    """An empty database for Dagster's storage; yields the DAGSTER_PG_* variables naming it."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    info = psycopg.conninfo.conninfo_to_dict(ADMIN_DSN)
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {
            "DAGSTER_PG_HOST": info.get("host", "127.0.0.1"),
            "DAGSTER_PG_PORT": str(info.get("port", "5432")),
            "DAGSTER_PG_USER": info.get("user", "postgres"),
            "DAGSTER_PG_PASSWORD": info.get("password", ""),
            "DAGSTER_PG_DB": name,
        }
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def dagster_home(path: Path) -> Path:
    """A DAGSTER_HOME holding the repository's own dagster.yaml."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "dagster.yaml", path / "dagster.yaml")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def background(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """A subprocess in its own process group, stopped (group and all) on exit."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args,
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            _stop_group(proc)


def _started(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, from /proc."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[19])
    return None


def _descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, start time) of every live process below `pid`: a daemon's code servers run in
    sessions of their own, out of reach of its process group."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        if (found := _started(int(entry))) is not None:
            children.setdefault(found[0], []).append((int(entry), found[1]))
    below, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            below.append(child)
            todo.append(child[0])
    return below


def _stop_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    below = _descendants(proc.pid)
    for sig, wait in ((signal.SIGINT, 10), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    # What outlived the group (a code server whose daemon is gone) is stopped too.
    for pid, start in below:
        if (now := _started(pid)) is not None and now[1] == start:  # not a reused pid
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def backfill_command(partitions: list[str], job: str = "lake_writer_job") -> list[str]:
    """`dagster job backfill` of `job` over `partitions`, on the repository's workspace."""
    return [
        str(BIN / "dagster"),
        "job",
        "backfill",
        "-w",
        str(REPO / "workspace.yaml"),
        "-j",
        job,
        "--partitions",
        ",".join(partitions),
        "--noprompt",
    ]


def materialize_partition(defs, instance, job: str, tenant_id: str):
    """Run `job` in process for the tenant's partition: (its result, asset key -> metadata values
    of its materializations, each checked to be of that partition)."""
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [tenant_id])
    result = defs.resolve_job_def(job).execute_in_process(
        partition_key=tenant_id, instance=instance
    )
    assert result.success
    found = {}
    for event in result.get_asset_materialization_events():
        m = event.event_specific_data.materialization
        assert m.partition == tenant_id
        found[m.asset_key] = {k: v.value for k, v in m.metadata.items()}
    return result, found
