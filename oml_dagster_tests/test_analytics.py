"""Lake analytics: every number the analytics assets report equals the one computed directly from
the workload that produced it (the test's own record of its acts, or Postgres' outbox), DuckDB
reads every table as the Delta log counts it, and a table the second reader cannot read fails
its check."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from dagster import AssetKey

from oml_dagster import cli
from oml_dagster.defs.analytics import ANALYTICS_KEYS
from oml_dagster.lake.analytics import areas, lag, reports, sandbox, second_reader
from oml_dagster.lake.model.tables import GOLD_AREAS, SILVER_CLAIMS
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import tenant_tables
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.lake.write.writer import WriterConfig
from oml_dagster.simulate import acts, producer
from oml_dagster.simulate.runner import run
from oml_dagster.simulate.workload import WorkloadConfig

from .dagster_support import materialize_partition
from .helpers import drain_all, make_tree, new_id


class Record:
    """What the test did to one tenant, kept as it acts: the expected answers."""

    def __init__(self, conn, keys):
        self.conn, self.keys = conn, keys
        self.tree = make_tree(conn, keys)
        self.claims: dict[str, dict] = {}  # artifact_id -> state, workarea_id, provenance, sims
        self.objects: dict[str, acts.Claim] = {}
        self.edges: dict[str, tuple[str, str, str]] = {}  # edge_id -> graph, label, state
        self.links: list[tuple[str, str]] = []  # ratified derives_from claim links

    def promote(self, workarea_id: str, provenance: str = "agent", **kw) -> acts.Claim:
        c = acts.Claim(new_id(), 1, workarea_id, "u.x", provenance=provenance, **kw)
        acts.promote(self.conn, self.keys, c, f"body {c.artifact_id}".encode())
        self.claims[c.artifact_id] = {
            "state": "promoted",
            "workarea_id": workarea_id,
            "provenance": provenance,
            "sims": {c.simulation_id, *(c.sim_derived_ids or ())} - {None},
        }
        self.objects[c.artifact_id] = c
        return c

    def demote(self, c: acts.Claim) -> None:
        acts.demote(self.conn, self.keys, c)
        self.claims[c.artifact_id]["state"] = "demoted"

    def erase(self, c: acts.Claim) -> None:
        acts.erase(self.conn, self.keys, c)
        self.claims[c.artifact_id]["state"] = "erased"

    def reassign(self, c: acts.Claim, workarea_id: str, held: bool) -> None:
        acts.reassign(self.conn, self.keys, c, workarea_id, held)
        self.claims[c.artifact_id]["workarea_id"] = workarea_id
        if held:
            self.claims[c.artifact_id]["state"] = "held"

    def derive(self, src: acts.Claim, dst: acts.Claim, label: str = "derives_from") -> str:
        edge = acts.Edge(new_id(), src.artifact_id, dst.artifact_id, edge_label=label)
        acts.ratify(self.conn, self.keys, edge)
        self.edges[edge.edge_id] = ("claim", label, "ratified")
        if label == "derives_from":
            self.links.append((f"{src.artifact_id}:1", f"{dst.artifact_id}:1"))
        return edge.edge_id

    def relate_areas(self, src: str, dst: str) -> str:
        edge = acts.Edge(
            new_id(),
            src,
            dst,
            graph="workarea",
            edge_label="relates_to",
            src_version=None,
            dst_version=None,
        )
        acts.ratify(self.conn, self.keys, edge)
        self.edges[edge.edge_id] = ("workarea", "relates_to", "ratified")
        return edge.edge_id

    def demote_edge(self, edge_id: str) -> None:
        acts.demote_edge(self.conn, self.keys, edge_id)
        graph, label, _ = self.edges[edge_id]
        self.edges[edge_id] = (graph, label, "demoted")
        if (graph, label) == ("claim", "derives_from"):
            raise AssertionError("keep derivation links ratified in this workload")


@pytest.fixture
def record(conn, lake, tenant) -> Record:
    """A tenant with claims in every state and provenance, a derivation chain of three links
    (plus a branch), a supersession, a workarea edge demoted, and a simulation's taint closure."""
    r = Record(conn, tenant)
    t = r.tree
    c1 = r.promote(t.a, "human")
    c2 = r.promote(t.a, "agent")
    c3 = r.promote(t.b, "connector")
    c4 = r.promote(t.a1, "agent")
    side = r.promote(t.b, "agent")
    sim = new_id()
    s1 = r.promote(t.b, "simulation", simulation_id=sim)
    s2 = r.promote(t.b, "agent", sim_derived_ids=[sim])
    r.derive(c4, c3)
    r.derive(c3, c2)
    r.derive(c2, c1)
    r.derive(side, c1)
    r.derive(s2, s1)
    r.derive(c4, c2, "supersedes")
    r.demote_edge(r.relate_areas(t.a, t.b))
    r.demote(c2)
    r.erase(c3)
    r.reassign(side, t.a1, held=True)
    r.reassign(c1, t.b, held=False)
    drain_all(conn, lake)
    return r


def materialize_analytics(defs, instance, tenant_id: str):
    result, found = materialize_partition(defs, instance, "lake_analytics_job", tenant_id)
    assert sorted(found) == sorted(ANALYTICS_KEYS)
    checks = {
        e.asset_key: e for e in result.get_asset_check_evaluations()
    }  # one per analytics asset
    return found, checks


def outbox_event_volume(conn, tenant_id: str) -> Counter:
    """(day, event_type, provenance) -> events, from the journal events in the outbox that the
    writer did not refuse."""
    counts: Counter = Counter()
    for (payload,) in conn.execute(
        "SELECT o.payload FROM oml.outbox o LEFT JOIN oml.lake_dead_letter d ON d.seq = o.seq"
        " WHERE o.tenant_id = %s AND o.op = 'journal.event' AND d.seq IS NULL",
        (tenant_id,),
    ):
        at = dt.datetime.fromisoformat(payload["at"].replace("Z", "+00:00"))
        key = (at.astimezone(dt.UTC).date(), payload["event_type"], payload["provenance"] or "none")
        counts[key] += 1
    return counts


def test_every_analytics_number_equals_the_workload(conn, lake, record, defs, instance):
    tenant_id = record.keys.tenant_id
    meta, checks = materialize_analytics(defs, instance, tenant_id)

    # Event volume: the outbox's journal events, grouped the same way.
    expected_volume = outbox_event_volume(conn, tenant_id)
    with sandbox.tenant_connection(lake, tenant_id) as tc:
        volume = reports.event_volume(tc)
        claims = reports.claims_by_state(tc)
        lineage = reports.lineage_stats(tc)
    assert {
        (r["event_date"], r["event_type"], r["provenance"]): r["events"] for r in volume
    } == dict(expected_volume)
    v = meta[AssetKey(["analytics", "event_volume"])]
    assert v["events"] == sum(expected_volume.values())
    by_type: Counter = Counter()
    for (_, event_type, _), n in expected_volume.items():
        by_type[event_type] += n
    assert v["by_event_type"] == dict(by_type)
    assert "claim.promoted" in v["volume"] and "| event_date |" in v["volume"]

    # Claims by state, workarea and provenance: the test's record.
    expected_claims = Counter(
        (c["state"], c["workarea_id"], c["provenance"]) for c in record.claims.values()
    )
    assert {(r["state"], r["workarea_id"], r["provenance"]): r["claims"] for r in claims} == dict(
        expected_claims
    )
    paths = {record.tree.a: "u.a", record.tree.b: "u.b", record.tree.a1: "u.a.a1"}
    assert all(r["workarea_path"] == paths[r["workarea_id"]] for r in claims)
    c = meta[AssetKey(["analytics", "claims_by_state"])]
    states = Counter(x["state"] for x in record.claims.values())
    for state in ("promoted", "held", "demoted", "erased"):
        assert c[f"claims_{state}"] == states[state], state
    assert c["claims"] == len(record.claims)

    # Lineage: edges by label and state, the longest chain, the taint closure.
    expected_edges = Counter(record.edges.values())
    assert {(r["graph"], r["edge_label"], r["state"]): r["edges"] for r in lineage.edges} == dict(
        expected_edges
    )
    assert lineage.longest_chain == 3  # c4 -> c3 -> c2 -> c1
    assert lineage.chains[0]["chain_edges"] == 3
    sims = {s for c in record.claims.values() for s in c["sims"]}
    expected_closure = {s: sum(1 for c in record.claims.values() if s in c["sims"]) for s in sims}
    assert {r["simulation_id"]: r["closure_rows"] for r in lineage.tainted} == expected_closure
    ln = meta[AssetKey(["analytics", "lineage_stats"])]
    assert ln["edges"] == len(record.edges)
    assert ln["longest_derivation_chain"] == 3
    assert ln["largest_taint_closure"] == max(expected_closure.values())

    # Lake lag: one entry per writer commit in the tables' logs, every lag positive.
    lag = meta[AssetKey(["analytics", "lake_lag"])]
    logged = [c for _, _, uri in tenant_tables(lake, tenant_id) for c in _log_commits(uri)]
    assert lag["writer_commits"] == len(logged) > 0
    assert 0 < lag["latest_lag_seconds/silver.claims"] <= lag["latest_lag_seconds_max"]
    assert "| silver.claims |" in lag["lag"]

    # Every analytics asset's second-reader check passed.
    assert set(checks) == set(ANALYTICS_KEYS)
    assert all(e.passed for e in checks.values())


def _log_commits(uri: str) -> list[tuple[int, int, int, int]]:
    """(version, timestamp ms, batch_start, batch_end) of the writer commits, straight from the
    table's _delta_log JSON files."""
    found = []
    log = Path(uri) / "_delta_log"
    for path in sorted(log.glob("*.json")):
        for line in path.read_text().splitlines():
            info = json.loads(line).get("commitInfo")
            if info and "oml.batch_end" in info:
                found.append(
                    (
                        int(path.stem),
                        info["timestamp"],
                        int(info["oml.batch_start"]),
                        int(info["oml.batch_end"]),
                    )
                )
    return found


def test_lake_lag_is_commit_time_minus_the_oldest_op_of_each_batch(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    many_commits = DrainPolicy(until_idle=True, config=WriterConfig(max_batch=3, txn_lag_limit=1))
    drain(conn, lake, policy=many_commits)
    acts.upsert_area(conn, tenant, tree.b, crew_name="crew")
    drain_all(conn, lake)
    tables = [(t.table, t.uri) for t in tenant_tables(lake, tenant.tenant_id)]
    lags = lag.lake_lag(conn, lake, tenant.tenant_id, tables)

    created = dict(
        conn.execute(
            "SELECT seq, created_at FROM oml.outbox WHERE tenant_id = %s", (tenant.tenant_id,)
        ).fetchall()
    )
    expected = {}
    for name, uri in tables:
        for version, ms, lo, hi in _log_commits(uri):
            oldest = min(at for seq, at in created.items() if lo < seq <= hi)
            committed = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
            expected[(str(name), version)] = (committed - oldest).total_seconds()
    assert {(c.table, c.version): c.lag_seconds for c in lags} == pytest.approx(expected)
    assert len([k for k in expected if k[0] == "gold.areas"]) >= 3
    assert all(lag > 0 for lag in expected.values())
    summary = {r["table"]: r for r in lag.lag_summary(lags)}
    assert summary["gold.areas"]["max_lag_seconds"] == pytest.approx(
        max(v for (t, _), v in expected.items() if t == "gold.areas")
    )


def test_second_reader_reads_every_table_as_the_log_counts_it(conn, lake):
    run(os.environ["OML_PG_DSN"], WorkloadConfig(tenants=2, claims=30, seed=4, bad_ratio=0.05))
    drain_all(conn, lake)
    tenants = [str(t) for (t,) in conn.execute("SELECT DISTINCT tenant_id FROM oml.outbox")]
    for tenant_id in tenants:
        expected_volume = outbox_event_volume(conn, tenant_id)
        with sandbox.tenant_connection(lake, tenant_id) as tc:
            checks = second_reader.second_reader_check(lake, tc)
            volume = reports.event_volume(tc)
        names = {c.table for c in checks}
        assert {"bronze.events", "silver.claims", "gold.lineage", "gold.areas"} <= names
        assert all(c.agrees and c.duckdb_rows == c.log_rows for c in checks), checks
        # Bad input was dead-lettered, not counted.
        assert {
            (r["event_date"], r["event_type"], r["provenance"]): r["events"] for r in volume
        } == dict(expected_volume)


def test_a_table_the_second_reader_cannot_read_fails_its_check(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    acts.promote(conn, tenant, acts.Claim(new_id(), 1, tree.a, "u.a"), b"body")
    drain_all(conn, lake)
    silver = lake.table_uri(tenant.tenant_id, SILVER_CLAIMS)
    for data_file in Path(silver).glob("*.parquet"):
        data_file.unlink()  # the log still lists it
    with sandbox.tenant_connection(lake, tenant.tenant_id) as tc:
        checks = {c.table: c for c in second_reader.second_reader_check(lake, tc)}
    assert not checks["silver.claims"].agrees
    assert checks["silver.claims"].error
    assert checks["bronze.events"].agrees and checks["gold.areas"].agrees


def test_a_tenant_without_tables_has_empty_views(lake):
    tenant_id = new_id()
    with sandbox.tenant_connection(lake, tenant_id) as tc:
        assert sorted(tc.views) == ["bronze_events", "gold_areas", "gold_lineage", "silver_claims"]
        assert reports.event_volume(tc) == []
        assert reports.claims_by_state(tc) == []
        assert reports.lineage_stats(tc).longest_chain == 0
        assert second_reader.second_reader_check(lake, tc) == []


def test_longest_paths_follow_links_and_survive_cycles():
    links = [("d", "c"), ("c", "b"), ("b", "a"), ("x", "a"), ("p", "q"), ("q", "p")]
    lengths = reports.longest_paths(links)
    assert lengths["d"] == 3 and lengths["c"] == 2 and lengths["x"] == 1 and lengths["a"] == 0
    # A cycle is cut where the walk comes back to its start, not looped forever.
    assert sorted([lengths["p"], lengths["q"]]) == [0, 1]


def test_nothing_decrypts_bodies():
    """The analytics never touch key material: no DEK table, no AES in any of its modules."""
    modules = sorted(Path(sandbox.__file__).parent.glob("*.py"))
    assert len(modules) >= 6
    for module in modules:
        source = module.read_text()
        for needle in ("oml_sim", "AESGCM", "open_body", "deks"):
            assert needle not in source, (module.name, needle)


@pytest.mark.s3
def test_lakes_on_s3_are_read_with_the_lakes_storage_options(
    conn, s3_lake, tenant, monkeypatch, capsys
):
    tree = make_tree(conn, tenant)
    acts.promote(conn, tenant, acts.Claim(new_id(), 1, tree.a, "u.a"), b"body")
    other = producer.create_tenant(conn)
    make_tree(conn, other)
    drain_all(conn, s3_lake)
    with sandbox.tenant_connection(s3_lake, tenant.tenant_id, lockdown=True) as tc:
        checks = second_reader.second_reader_check(s3_lake, tc)
        volume = reports.event_volume(tc)
        replay = areas.replay_areas(tenant.tenant_id, areas.area_events(tc))
        gold = areas.gold_areas(tc)
        # Locked down, the connection reads nothing under another tenant's prefix.
        elsewhere = s3_lake.table_uri(other.tenant_id, GOLD_AREAS)
        with pytest.raises(duckdb.PermissionException):
            tc.con.execute(f"SELECT count(*) FROM delta_scan('{elsewhere}')").fetchall()
    assert {c.table for c in checks} == {
        "bronze.events",
        "silver.claims",
        "gold.lineage",
        "gold.areas",
    }
    assert all(c.agrees for c in checks), checks
    assert sum(r["events"] for r in volume) == 5
    assert areas.area_differences(replay.areas, gold) == []
    assert isinstance(s3_lake, Lake) and not s3_lake.is_local

    # The command line reaches the same lake from the environment.
    monkeypatch.setenv("OML_LAKE_URI", s3_lake.root)
    monkeypatch.setenv("OML_LAKE_STORAGE_OPTIONS", json.dumps(s3_lake.storage_options))
    query = "SELECT count(*) AS n FROM gold_areas"
    assert cli.main(["sql", "--tenant", tenant.tenant_id, "--json", query]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 4}]
    assert cli.main(["areas-at", "--tenant", tenant.tenant_id]) == 0
    assert "matches gold.areas (4 nodes)" in capsys.readouterr().out
