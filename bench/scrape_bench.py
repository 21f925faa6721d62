"""One scrape of `oml-lake exporter` at N tenants: its time over HTTP, the statements it costs
PostgreSQL and the series it serves, beside two baselines from the same run: the freshness
check's lag read one tenant at a time (what a scrape would cost without set-based statements),
and prometheus-client's own HTTP server rendering every family at each scrape with its default
escaping (what `MetricsServer` replaces).

The database is shaped by SQL: every tenant has a policy row, a sequencer row, its four core
tables in the frontier cache and `--ops` outbox rows, of which some are drained, some sequenced
and waiting, some unsequenced (a tenant in ten behind a journal gap); a tenant in ten has an open
dead letter, and every tenant an erase not yet sequenced. The lake cache holds four tables per
tenant (synthetic numbers: a scrape reads the cache, never the lake; the lake's own refresh runs
in the background on its cadence). The exporter's collector is served as `oml-lake exporter`
serves it (`MetricsServer`) on loopback and scraped with OpenMetrics' Accept header, as
Prometheus does; statements are counted by a counting connection.

Then the lake's background refresh (`LakeCache.refresh`) over a real lake of `--lake-tenants`
tenants with a mixed workload each: its time per tenant, with the doctor's erasure verdict and
without it (what a refresh at many tenants costs, beside the refresh cadence).

    .venv/bin/python bench/scrape_bench.py --tenants 100 1000 --scrapes 20 --lake-tenants 10
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry, start_http_server

from oml_dagster.lake.audit.freshness import tenant_lag
from oml_dagster.lake.audit.metrics import (
    ExporterConfig,
    LakeCache,
    LakeMetrics,
    MetricsServer,
    TableMetrics,
    TableState,
    TenantLake,
)
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.simulate import producer

try:
    from bench._support import fresh_database, machine
except ImportError:  # run as a script
    from _support import fresh_database, machine

if __package__ is None or __package__ == "":  # run as a script: the repository's root first
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from oml_testbed.workloads import mixed_workload  # noqa: E402

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
CORE = ("bronze.events", "silver.claims", "gold.lineage", "gold.areas")


class CountingConnection(psycopg.Connection):
    """A connection that counts the statements it executes."""

    statements = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        CountingConnection.statements += 1
        return super().execute(*args, **kwargs)


def populate(dsn: str, tenants: int, ops: int) -> None:
    """`tenants` tenants shaped as the module docstring says, by SQL."""
    drained, waiting = ops // 2, ops // 4
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TEMP TABLE t AS SELECT gen_random_uuid() AS tenant_id, n"
            " FROM generate_series(1, %s) n",
            (tenants,),
        )
        conn.execute("INSERT INTO oml.tenant_policy (tenant_id) SELECT tenant_id FROM t")
        # Each tenant's ops: journal_seq 1..ops; the first drained+waiting sequenced.
        conn.execute(
            "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload, seq, created_at)"
            " SELECT t.tenant_id, j,"
            "  CASE WHEN j %% 20 = 0 THEN 'claim.erase' ELSE 'journal.event' END, '{}'::jsonb,"
            "  CASE WHEN j <= %s THEN (t.n - 1) * %s + j END,"
            "  now() - make_interval(secs => (%s - j) * 10)"
            " FROM t, generate_series(1, %s) j"
            " WHERE t.n %% 10 <> 0 OR j <> %s + 1",  # one tenant in ten: a gap after the cut
            (drained + waiting, ops, ops, ops, drained + waiting),
        )
        conn.execute(
            "INSERT INTO oml.sequencer_tenant (tenant_id, last_journal_seq, last_seq)"
            " SELECT tenant_id, %s, (n - 1) * %s + %s FROM t",
            (drained + waiting, ops, drained + waiting),
        )
        conn.execute(
            "INSERT INTO oml.lake_frontier (tenant_id, table_name, batch_end, txn_version)"
            " SELECT t.tenant_id, name, (t.n - 1) * %s + %s, (t.n - 1) * %s + %s"
            " FROM t, unnest(%s::text[]) name",
            (ops, drained, ops, drained, list(CORE)),
        )
        conn.execute(
            "INSERT INTO oml.lake_dead_letter (seq, tenant_id, journal_seq, op, payload, reason)"
            " SELECT (t.n - 1) * %s + 1, t.tenant_id, 1, 'claim.promote', '{}', 'refused'"
            " FROM t WHERE t.n %% 10 = 1",
            (ops,),
        )
        conn.execute("VACUUM (ANALYZE)")


def lake_cache(dsn: str, lake: Lake) -> LakeCache:
    cache = LakeCache(lake, judge_erasure=False)
    with psycopg.connect(dsn) as conn:
        tenants = [t for (t,) in conn.execute("SELECT tenant_id::text FROM oml.tenant_policy")]
    now = time.time()
    cache.tenants = {
        t: TenantLake(
            [
                TableState(name, 120, 4000, now, 12, 3, 20, {"compact": now, "checkpoint": now})
                for name in CORE
            ],
            "holds",
        )
        for t in tenants
    }
    cache.refreshed_at, cache.clean = now, True
    cache.publish()  # as a refresh ends
    return cache


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(url: str) -> tuple[float, str]:
    started = time.perf_counter()
    request = urllib.request.Request(url, headers={"Accept": OPENMETRICS})
    with urllib.request.urlopen(request, timeout=60) as answer:
        text = answer.read().decode()
    return time.perf_counter() - started, text


def run(tenants: int, ops: int, scrapes: int) -> dict[str, Any]:
    with fresh_database("oml_scrape") as dsn:
        populate(dsn, tenants, ops)
        cache = lake_cache(dsn, Lake("/nonexistent/oml-lake"))
        metrics = LakeMetrics(
            lambda: CountingConnection.connect(dsn, autocommit=True),
            cache,
            ExporterConfig(lag_bound_seconds=300.0),
        )
        registry = CollectorRegistry(auto_describe=False)
        registry.register(metrics)
        port = free_port()
        server = MetricsServer(registry, cache, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            scrape(url)  # the connection opened, the plans cached
            times, counts = [], []
            for _ in range(scrapes):
                before = CountingConnection.statements
                seconds, text = scrape(url)
                times.append(seconds)
                counts.append(CountingConnection.statements - before)
            # The baseline: prometheus-client's own server, every family rendered at each
            # scrape with its default escaping.
            library = CollectorRegistry(auto_describe=False)
            library.register(metrics)
            library.register(TableMetrics(cache.tenants))
            port = free_port()
            plain, _ = start_http_server(port, addr="127.0.0.1", registry=library)
            try:
                plain_times = [scrape(f"http://127.0.0.1:{port}/metrics")[0] for _ in range(3)]
            finally:
                plain.shutdown()
        finally:
            server.stop()
            metrics.close()
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        assert 'oml_lake_exporter_source_up{source="postgres"} 1.0' in text, text[:2000]
        # The baseline: each tenant's lag read on its own, as a per-tenant scrape would.
        with CountingConnection.connect(dsn, autocommit=True) as conn:
            ids = [t for (t,) in conn.execute("SELECT tenant_id::text FROM oml.tenant_policy")]
            before = CountingConnection.statements
            started = time.perf_counter()
            for t in ids:
                tenant_lag(conn, t)
            baseline_s = time.perf_counter() - started
            baseline_statements = CountingConnection.statements - before
    return {
        "tenants": tenants,
        "outbox_rows": tenants * ops,
        "scrapes": scrapes,
        "scrape_median_s": round(statistics.median(times), 3),
        "scrape_max_s": round(max(times), 3),
        "statements_per_scrape": max(counts),
        "series": series,
        "baseline_library_server_median_s": round(statistics.median(plain_times), 3),
        "baseline_per_tenant_lag_s": round(baseline_s, 3),
        "baseline_statements": baseline_statements,
    }


def lake_refresh(tenants: int, refreshes: int) -> dict[str, Any]:
    """The background refresh over a real lake on local disk: `tenants` tenants with a mixed
    workload each (five or six tables: the core four and curated ones), drained; the time of one
    refresh, with the doctor's erasure verdict and without it, per tenant."""
    with fresh_database("oml_refresh") as dsn, tempfile.TemporaryDirectory() as root:
        lake = Lake(os.path.join(root, "oml-lake"))
        with psycopg.connect(dsn, autocommit=True) as conn:
            ids = []
            for _ in range(tenants):
                keys = producer.create_tenant(conn)
                mixed_workload(conn, keys)
                ids.append(keys.tenant_id)
            sequencer.sequence(conn)
            drain(conn, lake, policy=DrainPolicy(until_idle=True))
        found: dict[str, Any] = {"lake_tenants": tenants}
        for judged in (True, False):
            cache = LakeCache(lake, judge_erasure=judged)
            times = []
            for _ in range(refreshes):
                started = time.perf_counter()
                cache.refresh(ids, lambda: psycopg.connect(dsn, autocommit=True))
                times.append(time.perf_counter() - started)
            assert cache.clean and not cache.errors, cache.errors
            key = "with_erasure_verdict" if judged else "tables_only"
            found[f"refresh_{key}_per_tenant_s"] = round(statistics.median(times) / tenants, 4)
        found["tables"] = sum(len(t.tables) for t in cache.tenants.values())
        return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, nargs="+", default=[1000])
    parser.add_argument("--ops", type=int, default=20, help="outbox rows per tenant")
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument(
        "--lake-tenants",
        type=int,
        default=10,
        help="tenants of the lake refresh's measure (0: none)",
    )
    args = parser.parse_args()
    print(machine(), flush=True)
    for n in args.tenants:
        print(json.dumps(run(n, args.ops, args.scrapes)), flush=True)
    if args.lake_tenants:
        print(json.dumps(lake_refresh(args.lake_tenants, 3)), flush=True)


if __name__ == "__main__":
    main()
