"""What every benchmark needs: a fresh database (migrated, with the simulator's schema) that is
dropped afterwards, a line describing the machine for the results, and the checkout whose code
a child drain runs."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg

import oml_dagster
from oml_dagster.lake import db
from oml_dagster.simulate import producer

ADMIN = os.environ.get("OML_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextlib.contextmanager
def fresh_database(prefix: str = "oml_bench") -> Iterator[str]:
    import uuid

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    info = psycopg.conninfo.conninfo_to_dict(ADMIN)
    info["dbname"] = name
    dsn = psycopg.conninfo.make_conninfo(**info)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            db.upgrade(conn)
            producer.ensure_schema(conn)
        yield dsn
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Snapshot:
    """The database at `dsn` as it is now, kept as a template, so that every run of a
    benchmark starts from the same state (`restore`), the sequencer's work included: a run
    after another would otherwise find the backlog already sequenced."""

    def __init__(self, dsn: str):
        self.name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        self.template = f"{self.name}_template"
        # Vacuumed and analyzed first: autovacuum would otherwise work on the template while
        # the first drain runs, and hand the later copies a vacuumed outbox (visibility map,
        # statistics) that the first did not have.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM (ANALYZE)")
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.template}" TEMPLATE "{self.name}"')

    def restore(self) -> None:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{self.name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{self.name}" TEMPLATE "{self.template}"')

    def drop(self) -> None:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')


def machine() -> str:
    """CPU count and model, memory, Python, PostgreSQL, load average: the context of a figure."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if "model name" in line), cpu)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        pg = subprocess.run(["psql", "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        pg = "psql ?"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"machine: {os.cpu_count()} CPUs ({cpu}), {mem:.1f} GiB; Python {platform.python_version()};"
        f" {pg}; load average {load}"
    )


# The checkout the benchmarks belong to: its code is what a child drain runs unless a baseline
# names another checkout.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def code_root(source: str | None) -> str:
    """The checkout whose `oml_dagster` a child drain runs (started in it, with it on
    PYTHONPATH), checked by importing it there.
    `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH: until
    3 Dec a baseline child started in the benchmark's own directory ran the benchmark's code,
    not the baseline's."""
    root = os.path.abspath(source or HERE)
    probe = [sys.executable, "-c", "import oml_dagster; print(oml_dagster.__file__)"]
    imported = subprocess.run(probe, cwd=root, env=child_env(root), capture_output=True, text=True)
    path = imported.stdout.strip()
    if imported.returncode != 0 or not path.startswith(root + os.sep):
        raise SystemExit(
            f"{root}: its oml_dagster is not what a child imports ({path or imported.stderr})"
        )
    return root


def child_env(root: str, **settings: str) -> dict[str, str]:
    """The environment of a child running checkout `root`'s code: this process's, with `root` on
    PYTHONPATH and `settings` added, less the allocator setting that importing `oml_dagster` put
    here (ADR 0041). A checkout that sets it sets it itself; an earlier one must run as it did.
    (A value equal to ours is taken for ours: an operator who set the very same one loses it in a
    baseline's child only.)"""
    env = {**os.environ, "PYTHONPATH": root, **settings}
    if env.get("_RJEM_MALLOC_CONF") == getattr(oml_dagster, "JEMALLOC_CONF", None):
        del env["_RJEM_MALLOC_CONF"]
    return env


def promoted_events(keys: producer.TenantKeys, n: int) -> list[dict]:
    """A chain of `n` signed `claim.promoted` journal events of one tenant (journal_seq 1..n), as
    producers write them; ids derived from the tenant and the seq, so a run repeats."""
    prev = producer.GENESIS_HASH
    at = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    tenant = uuid.UUID(keys.tenant_id)
    payloads = []
    for journal_seq in range(1, n + 1):
        artifact = str(uuid.uuid5(tenant, f"artifact {journal_seq}"))
        event = producer.Event(
            "claim.promoted",
            {"artifact_id": artifact, "version": 1, "ciphertext_digest": "ab" * 32},
            artifact_id=artifact,
            version=1,
            provenance="agent",
        )
        payload, prev = producer.journal_entry(
            keys,
            keys.tenant_id,
            journal_seq,
            prev,
            event,
            at + dt.timedelta(seconds=journal_seq),
            str(uuid.uuid5(tenant, f"event {journal_seq}")),
        )
        payloads.append(payload)
    return payloads
