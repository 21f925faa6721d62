"""The commit protocol (DESIGN §3): the skip rule, replays, racing writers, txn-only commits,
checkpoints and statistics."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from oml_dagster.lake.errors import InconsistentFrontier
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.model.tables import (
    APP_ID,
    BRONZE_EVENTS,
    CORE_TABLES,
    GOLD_AREAS,
    GOLD_CURATED,
    GOLD_LINEAGE,
    SILVER_CLAIMS,
    TableId,
)
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.open_tables import OpenTables, app_txn
from oml_dagster.lake.write.commit import (
    CommitObserver,
    CommitRules,
    TableCommit,
    commit_table,
    open_handle,
)
from oml_dagster.lake.write.drain import DrainObserver, DrainPolicy, drain
from oml_dagster.lake.write.writer import COMMITTED, SKIPPED, UNCHANGED, WriterConfig, drain_tenant
from oml_dagster.simulate import acts
from oml_dagster_tests.helpers import (
    BeforeEachCommit,
    LakeView,
    Tree,
    column_chunks,
    drain_all,
    lake_snapshot,
    make_tree,
    new_id,
    promoted,
)
from oml_testbed.workloads import mixed_workload  # noqa: F401  (other tests import it from here)


def more_work(conn, keys, tree: Tree) -> str:
    """More of everything on `mixed_workload`'s tree (a second root would be refused): a new
    area c under the root, claims promoted into c and b, a demote, an erase, an edge, then c
    committed and validated (the batch that holds this creates c's curated table). Returns c."""
    c = new_id()
    acts.upsert_area(conn, keys, c, path="u.c", status="development", parent_id=tree.root)
    made = [promoted(conn, keys, *((c, "u.c") if i % 2 else (tree.b, "u.b"))) for i in range(6)]
    acts.demote(conn, keys, made[0])
    acts.erase(conn, keys, made[2])
    acts.ratify(conn, keys, acts.Edge(new_id(), made[1].artifact_id, made[3].artifact_id))
    acts.upsert_area(conn, keys, c, status="committed")
    acts.validate_area(conn, keys, c)
    acts.upsert_area(conn, keys, tree.b, crew_name="crew-b2")
    return c


def versions(lake: Lake, tenant_id: str) -> dict:
    tables = {spec.name: lake.open(lake.table_uri(tenant_id, spec)) for spec in CORE_TABLES}
    return {name: table.version() if table is not None else None for name, table in tables.items()}


class _DiedBeforeSilver(Exception):
    """The writer dying between two commits of one batch."""


def table_states(lake: Lake, tenant_id: str, names: dict[str, str]) -> dict:
    """name -> (Delta version, recorded txn version) of each table `names` maps to its URI;
    (None, 0) for one that does not exist."""
    states = {}
    for name, uri in names.items():
        table = lake.open(uri)
        states[name] = (None, 0) if table is None else (table.version(), app_txn(table))
    return states


def batch_ends(lake: Lake, uri: str) -> dict[int, list[int]]:
    """batch_end -> the Delta versions of the table's commits that recorded it (commitInfo's
    `oml.batch_end`; maintenance commits record none)."""
    ends: dict[int, list[int]] = {}
    for commit in lake.open(uri).history():
        if "oml.batch_end" in commit:
            ends.setdefault(int(commit["oml.batch_end"]), []).append(commit["version"])
    return ends


def test_replaying_a_committed_batch_changes_nothing(conn, lake, tenant):
    """A batch whose commit landed on bronze, lineage and a curated table but not on silver or
    gold.areas (the writer died between them) is replayed: the tables that hold it are skipped,
    not committed again, the others catch up, and the lake equals a fault-free drain's. Replaying
    it once more changes nothing."""
    tenant_id = tenant.tenant_id
    tree = mixed_workload(conn, tenant)
    drain_all(conn, lake)  # batch one, fault-free: every table exists and holds it
    c = more_work(conn, tenant, tree)
    sequencer.sequence(conn)
    # Batch one ended at what bronze records; the batch under test is the rest of the outbox.
    first_end = app_txn(lake.open(lake.table_uri(tenant_id, BRONZE_EVENTS)))
    last_end = conn.execute(
        "SELECT max(seq) FROM oml.outbox WHERE tenant_id = %s", (tenant_id,)
    ).fetchone()[0]
    assert 0 < first_end < last_end
    uris = {spec.name: lake.table_uri(tenant_id, spec) for spec in CORE_TABLES}
    curated_a, curated_c = str(TableId.curated(tree.a)), str(TableId.curated(c))
    uris[curated_a] = lake.table_uri(tenant_id, GOLD_CURATED, tree.a)
    uris[curated_c] = lake.table_uri(tenant_id, GOLD_CURATED, c)
    before = table_states(lake, tenant_id, uris)
    assert before[curated_c] == (None, 0)
    assert all(txn == first_end for n, (_, txn) in before.items() if n != curated_c), before

    # Commit order (TenantBatch.commit): bronze, lineage, curated, silver, areas. The writer
    # dies once, when it reaches silver; c's curated table was created by then, a's has
    # nothing to change in this batch (no commit: fewer ops than the txn lag limit).
    landed = {BRONZE_EVENTS.name, GOLD_LINEAGE.name, curated_c}
    behind = {SILVER_CLAIMS.name, GOLD_AREAS.name}

    def die_before_silver(table: str) -> None:
        if table == SILVER_CLAIMS.name:
            raise _DiedBeforeSilver(table)

    with pytest.raises(_DiedBeforeSilver):
        drain_tenant(conn, lake, tenant_id, commits=BeforeEachCommit(die_before_silver))
    died = table_states(lake, tenant_id, uris)
    # (1) The first attempt really committed the batch on the tables before the failure point
    # (a new Delta version recording its end), and on none after it.
    for name in landed:
        version, txn = died[name]
        assert txn == last_end, (name, died[name])
        assert version is not None and (before[name][0] is None or version > before[name][0])
    for name in behind | {curated_a}:
        assert died[name] == before[name], (name, died[name], before[name])

    replay = drain_tenant(conn, lake, tenant_id)
    assert (replay.batch_start, replay.batch_end) == (first_end, last_end)
    assert not replay.refused  # the verdicts the first attempt recorded are reused
    replayed = table_states(lake, tenant_id, uris)
    # (3) The replay left the tables that held the batch alone, and brought the others to it.
    for name in landed | {curated_a}:
        assert replayed[name] == died[name], (name, replayed[name], died[name])
    for name in behind:
        assert replayed[name][1] == last_end and replayed[name][0] > died[name][0], name
    # Each table committed each batch once, the landed ones at the version the first attempt
    # made: one commit per batch end in every table's history.
    expected_ends = {
        **dict.fromkeys([*landed, *behind], [first_end, last_end]),
        curated_a: [first_end],
        curated_c: [last_end],
    }
    for name, uri in uris.items():
        ends = batch_ends(lake, uri)
        assert sorted(ends) == expected_ends[name], (name, ends)
        assert all(len(at) == 1 for at in ends.values()), (name, ends)
        if name in landed:
            assert ends[last_end] == [died[name][0]], (name, ends)
    # And by the skip rule itself (`batch_end <= txn`), not by the fallbacks behind it: without
    # it a landed table's output above its txn is empty and the no-change rule leaves it alone
    # too, so the effects above hold and only the action the writer reports tells them apart.
    actions = {t.name: t.action for t in replay.tables}
    assert actions == {
        **dict.fromkeys(landed, SKIPPED),
        curated_a: UNCHANGED,
        **dict.fromkeys(behind, COMMITTED),
    }, actions

    # (4) Replaying once more changes nothing: a's curated table still records batch one, so
    # the next drain reads (first_end, last_end] again, and every table skips it or has nothing
    # to change.
    after = lake_snapshot(lake, tenant_id)
    for _ in range(2):
        again = drain_tenant(conn, lake, tenant_id)
        assert not again.committed and not again.refused
        assert {t.action for t in again.tables} <= {SKIPPED, UNCHANGED}
        assert table_states(lake, tenant_id, uris) == replayed
        assert lake_snapshot(lake, tenant_id) == after

    # (2) The rows equal those of a fault-free drain of the same ops into a second lake. One
    # database serves both soundly: a drain of a named tenant starts where the Delta logs of
    # *its* lake say (drain.py: the frontier cache, per tenant and not per lake, is not read
    # for it), and the verdicts it reuses are per tenant by design (every writer and every
    # replay must apply the same ops) and were recorded by the first attempt's complete fold
    # before any table committed, so the fault came after them. The reference drain rewrites
    # the tenant's frontier cache rows, so it runs after every check on `lake`.
    reference = Lake(lake.root + "-reference")
    drain(conn, reference, [tenant_id], policy=DrainPolicy(until_idle=True))
    expected = lake_snapshot(reference, tenant_id)
    assert set(after) == set(uris) and after == expected
    # Neither lake is empty or short of the outbox: every journal event in bronze once, and the
    # claims of both batches in silver.
    journal = conn.execute(
        "SELECT count(*) FROM oml.outbox WHERE tenant_id = %s AND op = 'journal.event'",
        (tenant_id,),
    ).fetchone()[0]
    assert sorted(r["journal_seq"] for r in after[BRONZE_EVENTS.name]) == list(
        range(1, journal + 1)
    )
    assert len(after[SILVER_CLAIMS.name]) == 12 + 6
    assert sum(r["workarea_id"] == c for r in after[SILVER_CLAIMS.name]) == 3


def test_every_commit_records_the_txn_and_the_batch_bounds(conn, lake, tenant):
    mixed_workload(conn, tenant, claims=4)
    passes = drain(
        conn,
        lake,
        policy=DrainPolicy(until_idle=True, config=WriterConfig(max_batch=10, txn_lag_limit=5)),
    )
    batches = [b for p in passes for b in p.batches if b.committed]
    assert len(batches) > 3
    silver = lake.open(lake.table_uri(tenant.tenant_id, SILVER_CLAIMS))
    for commit in silver.history():
        if commit["operation"] in ("WRITE", "MERGE", "CREATE TABLE"):
            assert int(commit["oml.batch_start"]) < int(commit["oml.batch_end"])
            assert commit["oml.tenant_id"] == tenant.tenant_id
    assert silver.transaction_version(APP_ID) == max(
        b.outcome(TableId("silver.claims")).txn_after
        for b in batches
        if b.outcome(TableId("silver.claims"))
    )


def test_a_writer_that_loses_the_race_reloads_and_skips(conn, lake, tenant, dsn):
    mixed_workload(conn, tenant)
    sequencer.sequence(conn)
    paused, resume = threading.Event(), threading.Event()

    def hold_before_silver(table: str) -> None:
        if table == "silver.claims" and not paused.is_set():
            paused.set()
            assert resume.wait(60)

    results = {}

    def writer_a():
        with psycopg.connect(dsn, autocommit=True) as own:
            results["a"] = drain_tenant(
                own, lake, tenant.tenant_id, commits=BeforeEachCommit(hold_before_silver)
            )

    thread = threading.Thread(target=writer_a)
    thread.start()
    assert paused.wait(60)
    results["b"] = drain_tenant(conn, lake, tenant.tenant_id)
    resume.set()
    thread.join(60)

    a, b = results["a"], results["b"]
    assert a.batch_end == b.batch_end
    assert b.outcome(TableId("silver.claims")).action == "committed"
    silver_a = a.outcome(TableId("silver.claims"))
    assert silver_a.action == "skipped" and silver_a.attempts == 2, silver_a
    assert a.outcome(TableId("gold.areas")).action == "skipped"
    bronze = LakeView(lake, tenant.tenant_id).bronze
    assert len(bronze) == len({r["journal_seq"] for r in bronze})

    reference = Lake(lake.root + "-reference")
    drain(conn, reference, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert lake_snapshot(lake, tenant.tenant_id) == lake_snapshot(reference, tenant.tenant_id)


@pytest.mark.parametrize("round_", range(3))
def test_two_writers_racing_on_one_tenant_never_duplicate_or_lose(conn, lake, tenant, dsn, round_):
    """Two drains of one tenant with different batch sizes overlap: the one with the larger
    batches stops before its first silver commit (bronze and lineage committed) and the other
    drains meanwhile, from the lowest txn version with tables ahead of its batch (the skip
    rule), then both go on together. The lake holds every event once, as one writer's drain."""
    mixed_workload(conn, tenant, claims=10)
    errors = []
    results: list = []
    paused, first_batch_done = threading.Event(), threading.Event()

    class Racing(DrainObserver, CommitObserver):
        def __init__(self, holds: bool) -> None:
            self.holds = holds

        def table_commits(self) -> CommitObserver:
            return self

        def before(self, commit: TableCommit) -> None:
            if self.holds and str(commit.table) == SILVER_CLAIMS.name:
                self.holds = False
                paused.set()
                assert first_batch_done.wait(60)

        def batch_ended(self, result) -> None:
            results.append(result)
            if not self.holds:
                first_batch_done.set()

    def writer(max_batch: int, holds: bool) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as own:
                config = WriterConfig(max_batch=max_batch, txn_lag_limit=max(1, max_batch // 2))
                if not holds:
                    assert paused.wait(60)
                drain(
                    own,
                    lake,
                    [tenant.tenant_id],
                    policy=DrainPolicy(until_idle=True, config=config),
                    observer=Racing(holds),
                )
        except Exception as error:  # surfaced below
            errors.append(error)
            paused.set()
            first_batch_done.set()

    small, large = sorted([(7, 11), (5, 5), (13, 3)][round_])
    threads = [
        threading.Thread(target=writer, args=(large, True)),
        threading.Thread(target=writer, args=(small, False)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    # The race happened: the smaller batches' first one found bronze past its end (the other
    # drain committed it) and skipped it; and no commit of either drain moved a table's txn
    # version back.
    first_small = results[0]  # the other drain is held until this batch ends
    assert first_small.outcome(TableId(BRONZE_EVENTS.name)).action == SKIPPED, first_small
    moved_back = [t for r in results for t in r.tables if t.txn_after < t.txn_before]
    assert not moved_back, moved_back
    drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))

    bronze = LakeView(lake, tenant.tenant_id).bronze
    journal = conn.execute("SELECT count(*) FROM oml.outbox WHERE op = 'journal.event'").fetchone()[
        0
    ]
    assert sorted(r["journal_seq"] for r in bronze) == list(range(1, journal + 1))
    reference = Lake(lake.root + "-reference")
    drain(conn, reference, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert lake_snapshot(lake, tenant.tenant_id) == lake_snapshot(reference, tenant.tenant_id)


def test_a_table_with_nothing_to_change_gets_a_txn_only_commit_when_it_lags(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    for i in range(6):
        acts.upsert_area(
            conn, tenant, new_id(), path=f"u.x{i}", status="development", parent_id=tree.root
        )
    config = WriterConfig(max_batch=8, txn_lag_limit=4)
    drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True, config=config))
    silver = lake.open(lake.table_uri(tenant.tenant_id, SILVER_CLAIMS))
    assert silver is not None, "silver lagged more than the limit: a txn-only commit creates it"
    assert silver.to_pyarrow_table().num_rows == 0
    assert silver.transaction_version(APP_ID) >= 8
    areas = lake.open(lake.table_uri(tenant.tenant_id, GOLD_AREAS))
    # The Delta log alone bounds a replay: no table lags more than the limit plus a batch.
    last_seq = conn.execute("SELECT max(seq) FROM oml.outbox").fetchone()[0]
    assert last_seq - silver.transaction_version(APP_ID) <= 2 * 8
    assert areas.transaction_version(APP_ID) == last_seq


def test_a_small_idle_tail_makes_no_commit(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    drain_all(conn, lake)
    before = versions(lake, tenant.tenant_id)
    acts.upsert_area(conn, tenant, new_id(), path="u.z", status="development", parent_id=tree.root)
    drain_all(conn, lake)
    after = versions(lake, tenant.tenant_id)
    changed = {k for k in after if after[k] != before[k]}
    assert changed == {"bronze.events", "gold.areas"}


def test_a_table_ahead_of_the_recorded_verdicts_stops_the_writer(conn, lake, tenant):
    make_tree(conn, tenant)
    drain_all(conn, lake)
    conn.execute("DELETE FROM oml.lake_verdicts")
    with pytest.raises(InconsistentFrontier, match="verdicts are decided only through 0"):
        drain_tenant(conn, lake, tenant.tenant_id)


def test_checkpoint_every_100_versions(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    for i in range(100):
        acts.upsert_area(
            conn, tenant, new_id(), path=f"u.n{i}", status="development", parent_id=tree.root
        )
    drain(
        conn,
        lake,
        [tenant.tenant_id],
        policy=DrainPolicy(until_idle=True, config=WriterConfig(max_batch=2, txn_lag_limit=1)),
    )
    uri = lake.table_uri(tenant.tenant_id, GOLD_AREAS)
    table = lake.open(uri)
    assert table.version() >= 100
    log = os.listdir(os.path.join(uri, "_delta_log"))
    assert "00000000000000000099.checkpoint.parquet" in log
    last = Path(uri, "_delta_log", "_last_checkpoint").read_text()
    assert json.loads(last)["version"] >= 99
    assert table.metadata().configuration["delta.checkpointInterval"] == "100"


def test_only_the_checkpoint_commit_expires_the_log(lake):
    """delta-rs would list the whole `_delta_log` after every commit to expire old entries; the
    writer lets only the commit that writes a checkpoint do it (maintenance's daily log cleanup
    does the rest), so entries that have outlived the retention stay until that commit."""
    tenant_id = str(new_id())
    # A checkpoint every 10 versions keeps the test short; retention one hour.
    configuration = {**BRONZE_EVENTS.configuration(3600), "delta.checkpointInterval": "10"}
    tables = OpenTables(lake)
    seq = 0

    def commit() -> int:
        nonlocal seq
        seq += 1
        handle = open_handle(tables, tenant_id, BRONZE_EVENTS)
        outcome = commit_table(
            lake=lake,
            tenant_id=tenant_id,
            handle=handle,
            output=lambda _txn: BRONZE_EVENTS.schema.empty_table(),
            op_seqs=[seq],
            batch_end=seq,
            leading_txn=seq + 1,  # another table is ahead of this batch: a txn-only commit
            rules=CommitRules(
                txn_lag_limit=WriterConfig().txn_lag_limit,
                max_commit_attempts=WriterConfig().max_commit_attempts,
                configuration=configuration,
            ),
        )
        tables.keep(handle.uri, handle.table)
        return outcome.version

    while commit() < 12:
        pass
    uri = lake.table_uri(tenant_id, BRONZE_EVENTS)
    log_dir = Path(uri, "_delta_log")
    assert (log_dir / "00000000000000000009.checkpoint.parquet").exists()
    # Everything so far, the checkpoint at 9 included, outlived the retention two days ago.
    aged = 1_000_000_000
    for entry in log_dir.iterdir():
        os.utime(entry, (aged, aged))

    while commit() < 18:
        pass
    assert (log_dir / "00000000000000000000.json").exists()
    assert commit() == 19  # writes the checkpoint at 19, then expires what the one at 9 covers
    log = {p.name for p in log_dir.iterdir()}
    assert "00000000000000000019.checkpoint.parquet" in log
    assert not any(f"{v:020d}.json" in log for v in range(9))
    assert "00000000000000000009.checkpoint.parquet" in log
    assert {f"{v:020d}.json" for v in range(9, 20)} <= log
    assert lake.open(uri).transaction_version(APP_ID) == seq


def test_body_ciphertext_has_no_statistics_in_log_or_parquet(conn, lake, tenant):
    tree = make_tree(conn, tenant)
    made = [promoted(conn, tenant, tree.a) for _ in range(3)]
    drain_all(conn, lake)
    acts.demote(conn, tenant, made[0])  # a MERGE rewrite too
    drain_all(conn, lake)
    uri = lake.table_uri(tenant.tenant_id, SILVER_CLAIMS)
    table = lake.open(uri)
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert adds
    for add in adds:
        assert not [k for k, v in add.items() if "body_ciphertext" in k and v is not None]
    for name in sorted(os.listdir(uri)):
        if name.endswith(".parquet"):
            for column in column_chunks(os.path.join(uri, name)):
                if column.path_in_schema == "body_ciphertext":
                    assert column.statistics is None or not column.statistics.has_min_max, name
    for name in os.listdir(os.path.join(uri, "_delta_log")):
        if name.endswith(".json"):
            for line in Path(uri, "_delta_log", name).read_text().splitlines():
                add = json.loads(line).get("add")
                if add and add.get("stats"):
                    stats = json.loads(add["stats"])
                    assert all(
                        "body_ciphertext" not in stats.get(k, {})
                        for k in ("minValues", "maxValues", "nullCount")
                    )


def test_the_first_batch_creates_every_core_table_so_later_batches_do_not_reread(
    conn, lake, tenant
):
    tree = make_tree(conn, tenant)
    drain_all(conn, lake)
    for spec in CORE_TABLES:
        table = lake.open(lake.table_uri(tenant.tenant_id, spec))
        assert table is not None and table.transaction_version(APP_ID) > 0, spec.name
    promoted(conn, tenant, tree.a)
    first = sequencer.sequence(conn)
    result = drain_tenant(conn, lake, tenant.tenant_id)
    assert result.batch_start == first.tenants[tenant.tenant_id].first_seq - 1
    assert result.ops == 2
