"""`oml-lake exporter` (ADR 0065): the real command on a loopback port, scraped over HTTP,
against a real PostgreSQL and a real lake. A seeded workload's lag, waiting ops, ops behind a
journal gap, dead letters, erasure states, tables, reconciler results and writer counters come
out right per tenant; label values are tenant and table ids only; a PostgreSQL restart under it
is ridden through and shown as refresh errors; bad settings stop it with one line."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from oml_dagster.lake import db
from oml_dagster.lake.audit.doctor import AT_RISK, BREACHED, HOLDS
from oml_dagster.lake.audit.freshness import tenant_lags
from oml_dagster.lake.audit.metrics import PendingErases, erasure_state, maintenance_kind
from oml_dagster.lake.audit.reconcile import reconcile
from oml_dagster.lake.audit.reconcile import record as record_checks
from oml_dagster.lake.faults import EXIT_PERMANENT, EXIT_USAGE, RetryPolicy, classify
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.model.tables import APP_ID, SILVER_CLAIMS, TableId
from oml_dagster.lake.store.deltalog import last_checkpoint
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.maintenance import maintain
from oml_dagster.lake.write.counters import WriterCounters
from oml_dagster.lake.write.drain import DrainPolicy, drain, drain_riding_through
from oml_dagster.lake.write.writer import BatchResult, TableOutcome
from oml_dagster.simulate import acts, producer
from oml_testbed.fault_proxy import FaultProxy
from oml_testbed.s3_server import _free_loopback_port, lake_env, new_bucket, store_options

from .dagster_support import more_acts, seed_tenant

CLI = [sys.executable, "-m", "oml_dagster.cli"]
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@contextmanager
def exporter(dsn: str, lake_uri: str | None, **env: str) -> Iterator[str]:
    """The real command on a free loopback port; yields its /metrics URL once it serves."""
    address = f"127.0.0.1:{_free_loopback_port()}"
    proc = subprocess.Popen(
        [*CLI, "exporter", "--listen", address],
        env={
            **os.environ,
            "OML_PG_DSN": dsn,
            "OML_EXPORTER_LAKE_REFRESH_SECONDS": "0.5",
            **({"OML_LAKE_URI": lake_uri} if lake_uri else {}),
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert "serving" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        yield f"http://{address}/metrics"
        assert proc.poll() is None, "the exporter died: " + proc.stderr.read()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def scrape(url: str) -> tuple[str, Samples]:
    request = urllib.request.Request(url, headers={"Accept": OPENMETRICS})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
        text = answer.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return text, samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def until(url: str, ready, seconds: float = 60) -> tuple[str, Samples]:
    """Scrapes until `ready(samples)` (the lake thread's first refresh, a server back)."""
    deadline = time.monotonic() + seconds
    while True:
        text, samples = scrape(url)
        if ready(samples) or time.monotonic() > deadline:
            return text, samples
        time.sleep(0.3)


def _sequenced_not_drained(conn, work, n: int = 3) -> None:
    more_acts(conn, work, n)
    sequencer.sequence(conn)


def _behind_a_gap(conn, tenant_id: str) -> None:
    """An outbox row two past the tenant's last sequenced journal_seq: the act between is not
    visible, so the cut holds the row."""
    (last,) = conn.execute(
        "SELECT last_journal_seq FROM oml.sequencer_tenant WHERE tenant_id = %s", (tenant_id,)
    ).fetchone()
    conn.execute(
        "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload) VALUES (%s, %s, %s, %s)",
        (tenant_id, last + 2, "claim.demote", '{"artifact_id": "x"}'),
    )


def _erase_waiting(conn, keys, claim, age: dt.timedelta) -> None:
    """An erase of `claim` enqueued `age` ago and not drained."""
    acts.erase(conn, keys, claim)
    conn.execute(
        "UPDATE oml.outbox SET created_at = now() - %s WHERE id = "
        "(SELECT max(id) FROM oml.outbox WHERE tenant_id = %s AND op = 'claim.erase')",
        (age, keys.tenant_id),
    )


def test_a_scrape_shows_each_tenants_numbers(conn, dsn, lake):
    """Three tenants, drained through a first workload, then: A has sequenced ops waiting, an op
    behind a gap and a dead letter; B an erase waiting within a cadence of its deadline (at
    risk); C one waiting past it (breached). Every number the scrape shows is the one PostgreSQL
    and the lake give by the definitions the freshness check and the doctor use."""
    a, b, c = (seed_tenant(conn) for _ in range(3))
    sequencer.sequence(conn)
    counters = WriterCounters(lambda: psycopg.connect(dsn, autocommit=True))
    drain_riding_through(
        lambda: psycopg.connect(dsn, autocommit=True),
        lake,
        retry=RetryPolicy(attempts=2, seconds=5),
        policy=DrainPolicy(until_idle=True),
        counters=counters,
    )
    # A retry, as a drain that lost its PostgreSQL session records it.
    counters.retried(classify(psycopg.OperationalError("server closed the connection")))
    assert counters.flush()
    record_checks(conn, reconcile(conn, lake, a.keys.tenant_id))
    _sequenced_not_drained(conn, a, 3)
    _behind_a_gap(conn, a.keys.tenant_id)
    week = dt.timedelta(days=7)
    _erase_waiting(conn, b.keys, b.claims[0], week + dt.timedelta(hours=6))
    _erase_waiting(conn, c.keys, c.claims[0], week + dt.timedelta(days=2))
    sequencer.sequence(conn)
    # A dead letter of an op no catalog knows, named like a path: counted as `unknown`, its
    # name never a label.
    conn.execute(
        "INSERT INTO oml.lake_dead_letter (seq, tenant_id, journal_seq, op, payload, reason)"
        " VALUES (999999999, %s, 1, %s, '{}', 'unknown op')",
        (b.keys.tenant_id, "../../etc/secret op"),
    )
    # C's erasure bound of a second makes its maintenance checkpoint and vacuum now.
    conn.execute(
        "UPDATE oml.tenant_policy SET lake_erasure_bound = interval '1 second'"
        " WHERE tenant_id = %s",
        (c.keys.tenant_id,),
    )
    time.sleep(1.1)
    maintain(conn, lake, c.keys.tenant_id, task="checkpoint")
    before = tenant_lags(conn)
    ta, tb, tc = a.keys.tenant_id, b.keys.tenant_id, c.keys.tenant_id
    silver = lake.open(lake.table_uri(ta, SILVER_CLAIMS))

    with exporter(dsn, lake.root) as url:
        text, samples = until(
            url,
            lambda s: (
                value(s, "oml_lake_table_version", tenant=tc, table="silver.claims") is not None
            ),
        )
    after = tenant_lags(conn)

    lag = value(samples, "oml_lake_tenant_drain_lag_seconds", tenant=ta)
    assert before[ta].seconds <= lag <= after[ta].seconds
    assert value(samples, "oml_lake_tenant_ops_waiting", tenant=ta, state="sequenced") == (
        before[ta].ops_waiting
    )
    assert before[ta].ops_waiting >= 3
    assert value(samples, "oml_lake_tenant_ops_waiting", tenant=ta, state="unsequenced") == 1
    assert value(samples, "oml_lake_tenant_ops_behind_gap", tenant=ta) == 1
    assert value(samples, "oml_lake_tenant_oldest_unsequenced_age_seconds", tenant=ta) > 0
    assert value(samples, "oml_lake_tenant_ops_behind_gap", tenant=tb) == 0
    (last_seq,) = conn.execute(
        "SELECT last_seq FROM oml.sequencer_tenant WHERE tenant_id = %s", (ta,)
    ).fetchone()
    assert value(samples, "oml_lake_tenant_cut_seq", tenant=ta) == last_seq
    # The seeded self-signed promotion of each tenant is refused: one open dead letter each.
    for t in (ta, tb, tc):
        assert (
            value(
                samples, "oml_lake_tenant_dead_letters_open", tenant=t, **{"class": "claim.promote"}
            )
            == 1
        )
        assert (
            value(
                samples, "oml_lake_tenant_dead_letters_open", tenant=t, **{"class": "claim.erase"}
            )
            == 0
        )
    assert (
        value(samples, "oml_lake_tenant_dead_letters_open", tenant=tb, **{"class": "unknown"}) == 1
    )
    assert (
        value(samples, "oml_lake_tenant_dead_letters_open", tenant=ta, **{"class": "unknown"})
        is None
    )
    states = {
        t: {
            s: value(samples, "oml_lake_tenant_erasure_state", tenant=t, state=s.replace(" ", "_"))
            for s in (HOLDS, AT_RISK, BREACHED)
        }
        for t in (ta, tb, tc)
    }
    assert states[ta] == {HOLDS: 1, AT_RISK: 0, BREACHED: 0}
    assert states[tb] == {HOLDS: 0, AT_RISK: 1, BREACHED: 0}
    assert states[tc] == {HOLDS: 0, AT_RISK: 0, BREACHED: 1}
    pending_c = value(samples, "oml_lake_tenant_erasure_oldest_pending_seconds", tenant=tc)
    deadline = value(samples, "oml_lake_tenant_erasure_deadline_seconds", tenant=tc)
    assert deadline == 1 + dt.timedelta(days=1).total_seconds()
    assert value(samples, "oml_lake_tenant_erasure_deadline_seconds", tenant=tb) == (
        (week + dt.timedelta(days=1)).total_seconds()
    )
    assert pending_c > deadline
    # The lake's numbers, from the background refresh.
    key = {"tenant": ta, "table": "silver.claims"}
    assert value(samples, "oml_lake_table_version", **key) == silver.version()
    assert value(samples, "oml_lake_table_txn_version", **key) == silver.transaction_version(APP_ID)
    live = len(silver.file_uris())
    assert value(samples, "oml_lake_table_live_files", **key) == live
    assert 0 < value(samples, "oml_lake_table_small_files", **key) <= live
    assert value(samples, "oml_lake_table_versions_since_checkpoint", **key) == silver.version() + 1
    # C's maintenance: a checkpoint at the version it covers, at that commit's time; none on A's.
    c_silver_uri = lake.table_uri(tc, SILVER_CLAIMS)
    c_silver = lake.open(c_silver_uri)
    checkpointed = last_checkpoint(lake.filesystem(c_silver_uri))
    key_c = {"tenant": tc, "table": "silver.claims"}
    assert value(samples, "oml_lake_table_versions_since_checkpoint", **key_c) == (
        c_silver.version() - checkpointed
    )
    history = c_silver.history()
    stamps = {e["version"]: e["timestamp"] / 1000 for e in history}

    assert value(
        samples, "oml_lake_table_last_maintenance_timestamp_seconds", kind="checkpoint", **key_c
    ) == pytest.approx(stamps[checkpointed])
    assert (
        value(
            samples, "oml_lake_table_last_maintenance_timestamp_seconds", kind="checkpoint", **key
        )
        is None
    )
    # The reconciler's last recorded run of A: every check recorded, those failing with findings
    # (the open dead letter is one).
    assert (
        value(
            samples,
            "oml_lake_check_findings",
            tenant=ta,
            table="silver.claims",
            check="no_open_dead_letters",
        )
        == 1
    )
    assert value(samples, "oml_lake_check_last_run_timestamp_seconds", tenant=ta) is not None
    # The writer's counters, flushed when its drain ended.
    for t in (ta, tb, tc):
        assert value(samples, "oml_lake_writer_commits_total", tenant=t, action="committed") >= 4
        assert value(samples, "oml_lake_writer_batch_seconds_count", tenant=t) >= 1
    assert value(samples, "oml_lake_writer_last_report_timestamp_seconds") is not None
    assert (
        value(samples, "oml_lake_writer_retries_total", **{"class": "postgresql_connection_lost"})
        == 1
    )
    # Its own health.
    assert value(samples, "oml_lake_exporter_source_up", source="postgres") == 1
    assert value(samples, "oml_lake_exporter_source_up", source="lake") == 1
    assert value(samples, "oml_lake_exporter_scrape_statements") <= 10

    # Every series the shipped alert rules and the dashboard's queries name is one this scrape
    # serves.
    deploy = Path(__file__).resolve().parents[1] / "deploy"
    rules = (deploy / "prometheus" / "oml-lake.rules.yml").read_text()
    queries = " ".join(
        t["expr"]
        for p in json.loads((deploy / "grafana" / "oml-lake.json").read_text())["panels"]
        for t in p["targets"]
    )
    served = {name for name, _ in samples}
    for name in set(re.findall(r"\boml_lake_[a-z_]+", rules + " " + queries)):
        assert name in served, name
    # Tenant isolation of the labels: tenant ids, table ids and names from fixed sets; no path,
    # no DSN, no payload.
    tenants = {ta, tb, tc}
    table_id = re.compile(
        r"^(bronze\.events|silver\.claims|gold\.lineage|gold\.areas|gold\.curated(/[0-9a-f-]{36})?)$"
    )
    for _, labels in samples:
        for name, label in labels:
            if name == "tenant":
                assert label in tenants
            elif name == "table":
                assert table_id.match(label), label
            else:
                assert re.fullmatch(r"[a-z0-9_.]+", label), (name, label)
    assert lake.root not in text and "postgresql://" not in text and "/tmp" not in text
    assert "secret" not in text and "../" not in text


@given(
    age=st.floats(0, 30 * 86400),
    bound=st.floats(1, 10 * 86400),
    cadence=st.floats(0, 2 * 86400),
    dead=st.integers(0, 3),
    lake=st.sampled_from([None, HOLDS, AT_RISK, BREACHED]),
)
def test_the_erasure_state_is_never_better_than_either_source(age, bound, cadence, dead, lake):
    """The doctor's rule: breached past the deadline, at risk within a cadence of it or with a
    dead-lettered erase waiting; the lake's verdict can only make it worse."""
    state = erasure_state(PendingErases(1, age), dead, bound, dt.timedelta(seconds=cadence), lake)
    order = [HOLDS, AT_RISK, BREACHED]
    if age > bound + cadence:
        assert state == BREACHED
    elif age > bound or dead:
        assert order.index(state) >= order.index(AT_RISK)
    if lake is not None:
        assert order.index(state) >= order.index(lake)
    if age <= bound and not dead and lake in (None, HOLDS):
        assert state == HOLDS


def test_a_postgres_restart_is_ridden_through_and_shown(cluster, tmp_path):
    """PostgreSQL stopped under a serving exporter: scrapes still answer, with the PostgreSQL
    source down, its failed reads counted as transient, and no tenant series (nothing stale);
    once it is back the numbers are."""
    dsn = cluster.create_database(f"oml_exp_{uuid.uuid4().hex[:8]}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        db.upgrade(conn)
        producer.ensure_schema(conn)
        work = seed_tenant(conn)
        sequencer.sequence(conn)
    tenant_id = work.keys.tenant_id
    lagging = "oml_lake_tenant_drain_lag_seconds"
    with exporter(dsn, str(tmp_path / "oml-lake")) as url:
        _, up = scrape(url)
        assert value(up, lagging, tenant=tenant_id) > 0
        cluster.stop("fast")
        try:
            _, down = scrape(url)
            _, down = scrape(url)
        finally:
            cluster.start()
        assert value(down, "oml_lake_exporter_source_up", source="postgres") == 0
        assert (
            value(
                down,
                "oml_lake_exporter_refresh_errors_total",
                source="postgres",
                **{"class": "transient"},
            )
            >= 2
        )
        assert value(down, lagging, tenant=tenant_id) is None
        _, back = until(url, lambda s: value(s, lagging, tenant=tenant_id) is not None)
        assert value(back, "oml_lake_exporter_source_up", source="postgres") == 1
        assert value(back, lagging, tenant=tenant_id) > 0


@pytest.mark.s3
def test_an_object_store_outage_is_ridden_through_and_shown(conn, dsn, moto_endpoint):
    """The lake's store down under a serving exporter (every connection reset): PostgreSQL's
    numbers are still served, the lake's refresh errors are counted as transient and its age
    grows, the per-table numbers stay those of the last good read; once the store is back the
    refresh succeeds again."""
    bucket = new_bucket(moto_endpoint)
    direct = Lake(f"s3://{bucket}/oml-lake", store_options(moto_endpoint)).checked()
    work = seed_tenant(conn)
    drain(conn, direct, policy=DrainPolicy(until_idle=True))
    t = work.keys.tenant_id
    table = {"tenant": t, "table": "silver.claims"}
    lake_errors = "oml_lake_exporter_refresh_errors_total"
    transient = {"source": "lake", "class": "transient"}
    with FaultProxy(moto_endpoint, rate=0.0) as proxy:
        env = {
            **lake_env(proxy.endpoint, bucket),
            # One try per request: the outage shows at the next refresh, not after a minute of
            # object_store's own retries.
            "OML_LAKE_STORAGE_OPTIONS": '{"max_retries": "0", "retry_timeout": "2s"}',
        }
        with exporter(dsn, None, **env) as url:
            _, good = until(url, lambda s: value(s, "oml_lake_table_version", **table) is not None)
            assert value(good, "oml_lake_exporter_source_up", source="lake") == 1
            version = value(good, "oml_lake_table_version", **table)
            proxy.outage = True
            try:
                _, down = until(url, lambda s: (value(s, lake_errors, **transient) or 0) >= 1)
            finally:
                proxy.outage = False
            assert value(down, lake_errors, **transient) >= 1
            assert value(down, "oml_lake_exporter_source_up", source="lake") == 0
            assert value(down, "oml_lake_exporter_source_up", source="postgres") == 1
            assert value(down, "oml_lake_tenant_drain_lag_seconds", tenant=t) is not None
            assert value(down, "oml_lake_table_version", **table) == version
            _, back = until(
                url, lambda s: value(s, "oml_lake_exporter_source_up", source="lake") == 1
            )
            assert value(back, "oml_lake_exporter_source_up", source="lake") == 1
            assert value(back, "oml_lake_exporter_last_refresh_age_seconds", source="lake") < 30


@pytest.mark.parametrize(
    "args, env, code, named",
    [
        (["--listen", "localhost"], {}, EXIT_USAGE, "--listen"),
        (["--listen", "example.org:9464"], {}, EXIT_USAGE, "--listen"),
        (
            [],
            {"OML_FRESHNESS_BOUND_SECONDS": "soon"},
            EXIT_PERMANENT,
            "OML_FRESHNESS_BOUND_SECONDS",
        ),
        (
            [],
            {"OML_EXPORTER_LAKE_REFRESH_SECONDS": "0"},
            EXIT_PERMANENT,
            "OML_EXPORTER_LAKE_REFRESH_SECONDS",
        ),
        ([], {"OML_PG_DSN": "host=127.0.0.1 nonsense"}, EXIT_PERMANENT, "OML_PG_DSN"),
    ],
    ids=["no-port", "not-an-ip", "bound", "refresh", "dsn"],
)
def test_bad_settings_stop_it_with_one_line(args, env, code, named, tmp_path):
    done = subprocess.run(
        [*CLI, "exporter", "--listen", f"127.0.0.1:{_free_loopback_port()}", *args],
        env={**os.environ, "OML_LAKE_URI": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == code, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], done.stderr


def test_a_port_in_use_stops_it_with_one_line(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*CLI, "exporter", "--listen", f"127.0.0.1:{port}"],
            env={**os.environ, "OML_LAKE_URI": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == EXIT_PERMANENT, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0], done.stderr


def test_writer_counters_survive_a_failed_flush(dsn):
    """Increments a flush could not deliver (PostgreSQL not there) are added by the next one,
    once: a lost session delays counts, never loses or doubles them."""
    nowhere = f"postgresql://postgres@127.0.0.1:{_free_loopback_port()}/oml"
    target = [nowhere]
    counters = WriterCounters(
        lambda: psycopg.connect(target[0], autocommit=True, connect_timeout=2)
    )
    tenant_id = str(uuid.uuid4())
    counters.add(tenant_id, "commits", "committed", 3)
    assert counters.flush() is False
    counters.add(tenant_id, "commits", "committed", 2)
    target[0] = dsn
    assert counters.flush() is True
    assert counters.flush() is True
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT value FROM oml.lake_writer_counters WHERE tenant_id = %s AND name = 'commits'",
            (tenant_id,),
        ).fetchall()
        (beats,) = conn.execute(
            "SELECT value FROM oml.lake_writer_counters WHERE tenant_id IS NULL AND name = 'flushes'"
        ).fetchone()
    assert rows == [(5.0,)]
    assert beats == 2


def test_writer_counters_flush_within_a_long_pass(dsn):
    """A pass over many tenants can outlast the flush interval many times: the counts and the
    heartbeat reach PostgreSQL after the batch that passes the interval, not only at the pass's
    end, and not after every batch."""
    tenant_id = str(uuid.uuid4())
    counters = WriterCounters(lambda: psycopg.connect(dsn, autocommit=True), flush_seconds=1.0)
    result = BatchResult(tenant_id, 0, 5, ops=5)
    result.tables.append(TableOutcome(TableId("bronze.events"), "committed", version=1))

    def committed() -> float:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT value FROM oml.lake_writer_counters"
                " WHERE tenant_id = %s AND name = 'commits'",
                (tenant_id,),
            ).fetchone()
        return row[0] if row else 0.0

    counters.batch_ended(result)
    assert committed() == 0.0  # within the interval: kept
    time.sleep(1.05)
    counters.batch_ended(result)  # the interval passed, mid-pass: flushed
    assert committed() == 2.0
    counters.batch_ended(result)
    assert committed() == 2.0
    counters.flush()
    assert committed() == 3.0


@pytest.mark.parametrize(
    "entry, kind",
    [
        ({"operation": "OPTIMIZE", "oml.maintenance": "compact"}, "compact"),
        ({"operation": "OPTIMIZE", "operationParameters": {"zOrderBy": '["a"]'}}, "zorder"),
        ({"operation": "OPTIMIZE", "operationParameters": {"zOrderBy": "[]"}}, "compact"),
        ({"operation": "VACUUM END"}, "vacuum"),
        ({"operation": "MERGE", "oml.batch_end": 7}, None),
        ({"operation": "SET TBLPROPERTIES", "oml.maintenance": "properties"}, None),
    ],
)
def test_maintenance_kinds_from_the_log(entry, kind):
    assert maintenance_kind(entry) == kind
