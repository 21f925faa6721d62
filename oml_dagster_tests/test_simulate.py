"""`oml-lake simulate`: what it writes verifies with public keys alone, bodies and erasures are
as promised, validated areas stay clean, a seed fixes the workload, commits really come out of
order, and a drain of it lands every good event once and dead-letters every injected fault."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import psycopg

from oml_dagster import cli
from oml_dagster.lake.model.tables import BRONZE_EVENTS, GOLD_AREAS, SILVER_CLAIMS
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.simulate import verify
from oml_dagster.simulate.faults import FAULT_KEY, FAULTS
from oml_dagster.simulate.runner import RunConfig, run
from oml_dagster.simulate.workload import WorkloadConfig

from .conftest import curated_rows, table_rows

SMALL = WorkloadConfig(tenants=3, claims=40, seed=11, bad_ratio=0.08)
# Every hazard often, so a small run shows each of them.
HAZARDS = RunConfig(
    writers=4,
    acts_per_tx=4,
    contention=0.5,
    long_tx=0.1,
    long_tx_seconds=(0.02, 0.08),
    pair_wait=0.5,
)
# What the lake-writer says when it refuses each class of injected fault.
REASONS = {
    "unknown_op": "unknown op",
    "missing_field": "is missing",
    "mistyped_field": "expected an integer",
    "wrong_tenant_payload": "wrong tenant: payload tenant_id",
    "wrong_tenant_key": "wrong tenant: api key",
    "self_signed": "self_signed",
    "ratifier_is_proposer": "ratifier equals the proposer",
    "retract_not_held": "does not hold",
    "stale_fold_seq": "not newer than the row's fold_seq",
}
_INSTANTS = {"at", "created_at", "promoted_at", "proposed_at", "ratified_at", "retracted_at"}
_SIGNED = {"prev_hash", "hash", "sig", "signed_bytes"}


def _reset(conn: psycopg.Connection) -> None:
    conn.execute(
        "TRUNCATE oml.outbox, oml.claim_bodies, oml.api_keys, oml.tenant_policy,"
        " oml_sim.chain_head, oml_sim.signing_keys, oml_sim.deks RESTART IDENTITY"
    )


def _logical(value):
    """A payload without wall-clock instants and the signatures/hashes that cover them."""
    if isinstance(value, dict):
        return {k: _logical(v) for k, v in sorted(value.items()) if k not in _INSTANTS | _SIGNED}
    if isinstance(value, list):
        return [_logical(v) for v in value]
    return value


def _workload(conn: psycopg.Connection) -> dict[str, list[tuple]]:
    import json

    sequences: dict[str, list[tuple]] = defaultdict(list)
    rows = conn.execute(
        "SELECT tenant_id::text, journal_seq, op, payload FROM oml.outbox"
        " ORDER BY tenant_id, journal_seq, id"
    )
    for tenant_id, journal_seq, op, payload in rows:
        if op == "journal.event":
            payload = dict(payload, payload=_logical(json.loads(payload["payload"])))
        sequences[tenant_id].append((journal_seq, op, _logical(payload)))
    return dict(sequences)


def test_chain_and_signatures_verify_with_public_keys_alone(dsn, conn):
    report = run(dsn, SMALL, HAZARDS)
    heads = dict(
        conn.execute("SELECT tenant_id::text, journal_seq FROM oml_sim.chain_head").fetchall()
    )
    # No private key, no DEK and no chain head left: only oml.outbox and oml.api_keys.
    conn.execute("DROP SCHEMA oml_sim CASCADE")
    foreign = 0
    for tenant_id in report.tenants:
        result = verify.verify_chain(conn, tenant_id)
        assert result.ok, result.errors
        assert result.events == heads[tenant_id] > 50
        foreign += result.foreign_events
    assert foreign == report.faults["wrong_tenant_key"] > 0  # left out of the chains


def test_verifier_catches_tampering(dsn, conn):
    report = run(dsn, SMALL, RunConfig(writers=2))
    tenant_id = report.tenants[0]
    assert verify.verify_tenant(conn, tenant_id, open_bodies=True).ok

    # A signature swapped between two of the tenant's own events.
    conn.execute(
        "UPDATE oml.outbox SET payload = jsonb_set(payload, '{sig}', ("
        "  SELECT payload->'sig' FROM oml.outbox WHERE tenant_id = %(t)s"
        "  AND op = 'journal.event' AND journal_seq = 2 AND NOT payload ? %(f)s))"
        " WHERE tenant_id = %(t)s AND op = 'journal.event' AND journal_seq = 3"
        " AND NOT payload ? %(f)s",
        {"t": tenant_id, "f": FAULT_KEY},
    )
    errors = verify.verify_chain(conn, tenant_id).errors
    assert any("signature does not verify" in e for e in errors), errors

    # A body that no longer matches its promotion, and a DEK back for an erased version.
    artifact, version = conn.execute(
        "SELECT artifact_id, version FROM oml.claim_bodies WHERE tenant_id = %s LIMIT 1",
        (tenant_id,),
    ).fetchone()
    conn.execute(
        "UPDATE oml.claim_bodies SET body_ciphertext = body_ciphertext || '\\x00'::bytea"
        " WHERE tenant_id = %s AND artifact_id = %s AND version = %s",
        (tenant_id, artifact, version),
    )
    erased = conn.execute(
        "SELECT payload->>'artifact_id', (payload->>'version')::bigint FROM oml.outbox"
        " WHERE tenant_id = %s AND op = 'claim.erase' AND NOT payload ? %s LIMIT 1",
        (tenant_id, FAULT_KEY),
    ).fetchone()
    conn.execute(
        "INSERT INTO oml_sim.deks VALUES (%s, %s, %s, '\\x00'::bytea)", (tenant_id, *erased)
    )
    errors = verify.verify_tenant(conn, tenant_id).errors
    assert any("ciphertext digest differs" in e for e in errors), errors
    assert any("still has a DEK" in e for e in errors), errors


def test_ciphertext_digests_match_the_promotions(dsn, conn):
    report = run(dsn, SMALL, HAZARDS)
    for result in verify.verify(conn, report.tenants, open_bodies=True):
        assert result.ok, result.errors
        assert result.bodies > 0
    # The same, in SQL alone: every body hashes to its promotion's ciphertext_digest.
    mismatched, checked = conn.execute(
        "SELECT count(*) FILTER (WHERE NOT EXISTS ("
        "  SELECT 1 FROM oml.outbox o WHERE o.tenant_id = b.tenant_id AND o.op = 'claim.promote'"
        "  AND o.payload->>'artifact_id' = b.artifact_id::text"
        "  AND (o.payload->>'version')::bigint = b.version"
        "  AND o.payload->>'ciphertext_digest' = encode(sha256(b.body_ciphertext), 'hex'))),"
        " count(*) FROM oml.claim_bodies b"
    ).fetchone()
    assert (mismatched, checked > 50) == (0, True)


def test_erased_claims_have_no_body_and_no_dek(dsn, conn):
    run(dsn, SMALL, HAZARDS)
    erased, with_body, with_dek, had_body = conn.execute(
        "SELECT count(*), count(b.artifact_id), count(d.artifact_id),"
        " count(*) FILTER (WHERE EXISTS (SELECT 1 FROM oml.outbox p"
        "   WHERE p.tenant_id = e.tenant_id AND p.op = 'claim.promote'"
        "   AND p.payload->>'body_ref' = 'lake' AND p.payload->>'artifact_id' = e.a"
        "   AND (p.payload->>'version')::bigint = e.v))"
        " FROM (SELECT tenant_id, payload->>'artifact_id' AS a,"
        "       (payload->>'version')::bigint AS v FROM oml.outbox"
        "       WHERE op = 'claim.erase' AND NOT payload ? %s) e"
        " LEFT JOIN oml.claim_bodies b ON b.tenant_id = e.tenant_id"
        "  AND b.artifact_id::text = e.a AND b.version = e.v"
        " LEFT JOIN oml_sim.deks d ON d.tenant_id = e.tenant_id"
        "  AND d.artifact_id::text = e.a AND d.version = e.v",
        (FAULT_KEY,),
    ).fetchone()
    assert erased > 20 and had_body > 10
    assert (with_body, with_dek) == (0, 0)


def test_validated_areas_hold_no_tainted_rows(dsn, conn):
    report = run(dsn, SMALL, HAZARDS)
    results = verify.verify(conn, report.tenants)
    assert all(r.ok for r in results), [r.errors for r in results]
    assert all(r.validated_areas >= 1 for r in results)
    # ...and the workload really had tainted rows to keep out of them.
    tainted, closures = conn.execute(
        "SELECT count(*) FILTER (WHERE op = 'claim.promote' AND (payload->>'simulation_id'"
        "   IS NOT NULL OR jsonb_array_length(COALESCE(NULLIF(payload->'sim_derived_ids',"
        "   'null'::jsonb), '[]'::jsonb)) > 0)),"
        " array_agg(DISTINCT payload->>'demote_tainted') FILTER (WHERE op = 'simulation.end')"
        " FROM oml.outbox WHERE NOT payload ? %s",
        (FAULT_KEY,),
    ).fetchone()
    assert tainted > 10
    assert sorted(closures) == ["false", "true"]


def test_workload_covers_the_op_catalog(dsn, conn):
    report = run(dsn, SMALL, HAZARDS)
    for op in (
        "journal.event",
        "claim.promote",
        "claim.demote",
        "claim.erase",
        "claim.reassign",
        "claim.repair",
        "simulation.end",
        "edge.ratify",
        "edge.demote",
        "area.upsert",
        "area.reparent",
        "area.validate",
    ):
        assert report.ops[op] > 0, op
    assert set(report.faults) == set(FAULTS)
    held, repromoted, crews, statuses = conn.execute(
        "SELECT count(*) FILTER (WHERE op = 'claim.reassign' AND payload->>'held' = 'true'),"
        " (SELECT count(*) FROM (SELECT 1 FROM oml.outbox WHERE op = 'claim.promote'"
        "   AND NOT payload ? %(f)s GROUP BY tenant_id, payload->>'artifact_id',"
        "   payload->>'version' HAVING count(*) > 1) p),"
        " count(*) FILTER (WHERE op = 'area.upsert' AND payload ? 'crew_name'"
        "   AND NOT payload ? 'path'),"
        " count(*) FILTER (WHERE op = 'area.upsert' AND payload ? 'status'"
        "   AND NOT payload ? 'path')"
        " FROM oml.outbox WHERE NOT payload ? %(f)s",
        {"f": FAULT_KEY},
    ).fetchone()
    assert held > 0 and repromoted > 0 and crews > 0 and statuses > 0


def test_one_seed_writes_the_same_workload(dsn, conn):
    run(dsn, SMALL, HAZARDS)
    first = _workload(conn)
    _reset(conn)
    # Other writers, other batching: the same acts.
    run(dsn, SMALL, RunConfig(writers=2, acts_per_tx=7, contention=0.2))
    second = _workload(conn)
    assert sorted(first) == sorted(second)
    for tenant_id in first:
        assert first[tenant_id] == second[tenant_id], tenant_id

    _reset(conn)
    other = WorkloadConfig(SMALL.tenants, SMALL.claims, seed=SMALL.seed + 1, bad_ratio=0.08)
    run(dsn, other, RunConfig(writers=2))
    assert set(_workload(conn)).isdisjoint(first)


def test_commits_come_out_of_order(dsn, conn):
    """Within a tenant a later journal_seq can hold an older xid, and rows with lower outbox
    ids become visible after rows with higher ones."""
    seen = {"late_rows": 0}
    stop = threading.Event()

    def watch() -> None:
        with psycopg.connect(dsn, autocommit=True) as watcher:
            high, below = 0, 0
            while not stop.is_set():
                # Rows at or below the highest id seen last time that were not there then.
                count = watcher.execute(
                    "SELECT count(*) FROM oml.outbox WHERE id <= %s", (high,)
                ).fetchone()[0]
                seen["late_rows"] += max(0, count - below)
                high, below = watcher.execute(
                    "SELECT COALESCE(max(id), 0), count(*) FROM oml.outbox"
                ).fetchone()
                time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        report = run(dsn, SMALL, HAZARDS)
    finally:
        stop.set()
        watcher.join()

    inversions = conn.execute(
        "SELECT count(*) FROM ("
        "  SELECT xmin::text::bigint AS xid, max(xmin::text::bigint) OVER ("
        "    PARTITION BY tenant_id ORDER BY journal_seq, id"
        "    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS earlier"
        "  FROM oml.outbox) r WHERE xid < earlier"
    ).fetchone()[0]
    assert report.early_xid > 0
    assert inversions > 0, "no tenant has a later journal_seq with an older xid"
    assert report.late_commits > 0
    assert seen["late_rows"] > 0, "no row became visible below an id already visible"
    for result in verify.verify(conn, report.tenants):
        assert result.ok, result.errors


def test_rate_runs_a_paced_stream(dsn, conn):
    workload = WorkloadConfig(tenants=2, claims=100_000, seed=3)
    # A rate the producer reaches with ease on a busy 2-core machine (unpaced it writes several
    # times as many): the stream must keep to it, neither falling short nor running ahead.
    report = run(dsn, workload, RunConfig(writers=3, rate=120, duration=2.0))
    assert not report.exhausted
    assert 1.9 < report.elapsed < 4.0
    assert 0.7 * 120 < report.ops_per_second < 1.3 * 120
    assert report.transactions == report.acts  # one act per transaction in a stream
    for result in verify.verify(conn, report.tenants):
        assert result.ok, result.errors


def test_simulate_then_drain_lands_everything_once(dsn, conn, lake, capsys):
    code = cli.main(
        [
            "simulate",
            "--tenants",
            "2",
            "--claims",
            "30",
            "--seed",
            "5",
            "--writers",
            "3",
            "--bad-ratio",
            "0.15",
            "--no-progress",
        ]
    )
    assert code == 0
    assert "bad ops" in capsys.readouterr().out
    drain(conn, lake, policy=DrainPolicy(until_idle=True))
    assert conn.execute("SELECT count(*) FROM oml.outbox WHERE seq IS NULL").fetchone()[0] == 0

    # Dead letters are exactly the injected faults, each class with its reason.
    letters = conn.execute(
        "SELECT d.seq, d.reason, o.payload->>%s FROM oml.lake_dead_letter d"
        " JOIN oml.outbox o ON o.seq = d.seq",
        (FAULT_KEY,),
    ).fetchall()
    injected = {
        seq
        for (seq,) in conn.execute(
            "SELECT seq FROM oml.outbox WHERE payload ? %s", (FAULT_KEY,)
        ).fetchall()
    }
    assert {seq for seq, _, _ in letters} == injected
    reasons: dict[str, list[str]] = defaultdict(list)
    for _, reason, fault in letters:
        reasons[fault].append(reason)
    assert set(reasons) == set(FAULTS)
    for fault, expected in REASONS.items():
        assert all(expected in r for r in reasons[fault]), (fault, reasons[fault][:3])

    tenants = [t for (t,) in conn.execute("SELECT DISTINCT tenant_id::text FROM oml.api_keys")]
    for tenant_id in tenants:
        # Every good journal event in bronze, exactly once.
        good = {
            e
            for (e,) in conn.execute(
                "SELECT payload->>'event_id' FROM oml.outbox WHERE tenant_id = %s"
                " AND op = 'journal.event' AND NOT payload ? %s",
                (tenant_id, FAULT_KEY),
            )
        }
        bronze = [r["event_id"] for r in table_rows(lake, tenant_id, BRONZE_EVENTS)]
        assert len(bronze) == len(set(bronze)) == len(good) > 50
        assert set(bronze) == good

        # Silver holds every lawful promotion; erased rows hold no body.
        silver = table_rows(lake, tenant_id, SILVER_CLAIMS)
        promoted = {
            (a, v)
            for a, v in conn.execute(
                "SELECT payload->>'artifact_id', (payload->>'version')::bigint FROM oml.outbox"
                " WHERE tenant_id = %s AND op = 'claim.promote' AND NOT payload ? %s",
                (tenant_id, FAULT_KEY),
            )
        }
        assert {(r["artifact_id"], r["version"]) for r in silver} == promoted
        states = {r["state"] for r in silver}
        assert {"promoted", "demoted", "erased"} <= states
        assert all(r["body_ciphertext"] is None for r in silver if r["state"] == "erased")

        # Validated areas got curated tables without a tainted row.
        validated = [
            a["workarea_id"]
            for a in table_rows(lake, tenant_id, GOLD_AREAS)
            if a["status"] == "validated"
        ]
        assert validated
        for workarea_id in validated:
            for row in curated_rows(lake, tenant_id, workarea_id):
                assert row["simulation_id"] is None and not row["sim_derived_ids"]


def test_progress_bar_counts_the_claims_on_stderr(dsn, conn, capsys):
    workload = WorkloadConfig(tenants=2, claims=15, seed=21)
    run(dsn, workload, RunConfig(writers=1, progress=True))
    err = capsys.readouterr().err
    assert "simulate: 100%" in err and "30/30" in err and "ops" in err
