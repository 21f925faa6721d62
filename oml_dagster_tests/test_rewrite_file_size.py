"""The tables retracts MERGE keep small data files (decision 0026): a copy-on-write retract
rewrites every file holding a touched row, so the table property `delta.targetFileSize` that
writes, MERGE rewrites and Z-order read bounds what one retract copies, whatever the table size."""

from __future__ import annotations

import random
import uuid

import pyarrow as pa
from deltalake import write_deltalake

from oml_dagster.lake.model.tables import (
    CORE_TABLES,
    GOLD_CURATED,
    REWRITE_TARGET_FILE_SIZE,
    SILVER_CLAIMS,
    TableId,
)
from oml_dagster.lake.store import maintenance, rewrites
from oml_dagster.lake.store.reads import read_rows, tenant_tables
from oml_dagster.simulate import acts
from oml_dagster_tests.helpers import drain_all, new_id
from oml_dagster_tests.test_maintenance import commit_actions, small_batches

PROPERTY = "delta.targetFileSize"
BODY = 1024  # bytes of incompressible ciphertext per bulk claim


def append_claims(silver, rng: random.Random, rows: int) -> None:
    """Appends `rows` copies of silver's first row as new claims with random bodies of BODY
    bytes, in one file, with the writer's Parquet settings."""
    template = read_rows(silver, SILVER_CLAIMS)[0]
    bulk = pa.Table.from_pylist(
        [
            dict(
                template,
                artifact_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                claim_key=new_id(),
                body_ciphertext=rng.randbytes(BODY),
            )
            for _ in range(rows)
        ],
        schema=SILVER_CLAIMS.schema,
    )
    write_deltalake(
        silver, bulk, mode="append", writer_properties=maintenance.writer_properties(SILVER_CLAIMS)
    )


def test_silver_and_curated_carry_the_rewrite_file_size(conn, lake, tenant):
    small_batches(conn, lake, tenant, claims=4)
    seen = set()
    for name, spec, uri in tenant_tables(lake, tenant.tenant_id):
        config = lake.open(uri).metadata().configuration
        seen.add(spec.name)
        if spec in (SILVER_CLAIMS, GOLD_CURATED):
            assert config[PROPERTY] == str(REWRITE_TARGET_FILE_SIZE), name
        else:
            assert PROPERTY not in config, name
    assert seen == {spec.name for spec in (*CORE_TABLES, GOLD_CURATED)}


def test_zorder_and_a_retract_keep_files_at_the_target_size(conn, lake, tenant):
    """About 2.5 targets of incompressible rows: the Z-order (no size given) writes several
    files; a demote then replaces the one file holding its row with one file, so it copies at
    most a target's worth of rows (delta-rs's default target would make one large file)."""
    made = small_batches(conn, lake, tenant, claims=6, days=1)
    silver_uri = lake.table_uri(tenant.tenant_id, SILVER_CLAIMS)
    silver = lake.open(silver_uri)
    append_claims(silver, random.Random(11), int(2.5 * REWRITE_TARGET_FILE_SIZE) // BODY)

    (zordered,) = [
        r for r in maintenance.zorder(conn, lake, tenant.tenant_id) if r.table == SILVER_CLAIMS.name
    ]
    assert zordered.action == "rewrote"
    silver = lake.open(silver_uri)
    sizes = [a["size_bytes"] for a in pa.table(silver.get_add_actions(flatten=True)).to_pylist()]
    assert len(sizes) >= 2, f"Z-order wrote {len(sizes)} file(s) of {sizes}"
    assert max(sizes) <= 1.5 * REWRITE_TARGET_FILE_SIZE, sizes

    acts.demote(conn, tenant, made[1])
    drain_all(conn, lake)

    silver = lake.open(silver_uri)
    touched = commit_actions(silver_uri, silver.version())
    assert touched.get("remove") == 1 and touched.get("add") == 1, touched
    after = [a["size_bytes"] for a in pa.table(silver.get_add_actions(flatten=True)).to_pylist()]
    assert len(after) == len(sizes) and max(after) <= 1.5 * REWRITE_TARGET_FILE_SIZE, after


def test_a_drifted_file_size_property_is_restored_by_maintenance(conn, lake, tenant):
    small_batches(conn, lake, tenant, claims=3)
    uri = lake.table_uri(tenant.tenant_id, SILVER_CLAIMS)
    lake.open(uri).alter.set_table_properties({PROPERTY: str(512 * 2**20)})

    results = maintenance.vacuum(conn, lake, tenant.tenant_id)

    (updated,) = [r for r in results if r.operation == maintenance.PROPERTIES]
    assert updated.table == SILVER_CLAIMS.name and PROPERTY in updated.detail
    assert lake.open(uri).metadata().configuration[PROPERTY] == str(REWRITE_TARGET_FILE_SIZE)


def test_the_writer_s_packing_keeps_silver_at_its_target_size(conn, lake, tenant, monkeypatch):
    """The packing on the way bin-packs silver's small files into files of silver's own target,
    not the larger target of the other tables: what it packs stays as cheap to retract."""
    small_batches(conn, lake, tenant, claims=3, days=1)
    silver_uri = lake.table_uri(tenant.tenant_id, SILVER_CLAIMS)
    silver = lake.open(silver_uri)
    rng = random.Random(12)
    for _ in range(12):  # three targets' worth, in files of a quarter target
        append_claims(silver, rng, REWRITE_TARGET_FILE_SIZE // 4 // BODY)
    silver = lake.open(silver_uri)
    rows_before = silver.count()
    files_before = len(silver.file_uris())
    monkeypatch.setattr(rewrites, "SMALL_FILES_EVERY", 1)

    replaced = rewrites.compact_small_files(
        conn,
        silver,
        SILVER_CLAIMS,
        tenant_id=tenant.tenant_id,
        table_id=TableId(SILVER_CLAIMS.name),
        hooks=None,
    )

    silver = lake.open(silver_uri)
    sizes = [a["size_bytes"] for a in pa.table(silver.get_add_actions(flatten=True)).to_pylist()]
    assert replaced and replaced >= 12 and len(sizes) < files_before, (replaced, sizes)
    assert len(sizes) >= 3 and max(sizes) <= 1.5 * REWRITE_TARGET_FILE_SIZE, sizes
    assert rewrites.SMALL_FILE_TARGET > 1.5 * REWRITE_TARGET_FILE_SIZE  # what would be wrong
    assert silver.count() == rows_before  # packed, nothing lost or doubled
