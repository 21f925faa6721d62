"""Bloom filters on the columns the writer looks rows up by (decision 0044): a retract names
claims by artifact_id alone, and after a Z-order on (workarea_id, artifact_id) the statistics of
many files admit any one artifact; each file's bloom filter on artifact_id lets the query
engine pass over those that do not hold it without reading their rows."""

from __future__ import annotations

import random
import re
import uuid

import pyarrow as pa
from deltalake import QueryBuilder, write_deltalake

from oml_dagster.lake.model.tables import GOLD_CURATED, SILVER_CLAIMS, writer_properties
from oml_dagster.lake.store import maintenance
from oml_dagster.lake.store.reads import read_rows, tenant_tables
from oml_dagster.lake.store.sql import sql_in
from oml_dagster_tests.helpers import column_chunks
from oml_dagster_tests.test_maintenance import small_batches
from oml_dagster_tests.test_rewrite_file_size import append_claims


def bloomed_columns(lake, uri: str) -> dict[str, set[str]]:
    """Per live data file of the table, the columns whose chunks carry a bloom filter in every
    row group."""
    found = {}
    for path in lake.open(uri).file_uris():
        chunks = list(column_chunks(path))
        unfiltered = {
            c.path_in_schema
            for c in chunks
            if not (c.bloom_filter_offset and c.bloom_filter_length)
        }
        found[path] = {c.path_in_schema for c in chunks} - unfiltered
    return found


def check_blooms(lake, tenant_id: str, stage: str) -> set[str]:
    seen = set()
    for name, spec, uri in tenant_tables(lake, tenant_id):
        files = bloomed_columns(lake, uri)
        assert files, f"{stage}: {name} has no live files"
        for path, columns in files.items():
            assert columns == set(spec.lookup_columns), f"{stage}: {path} blooms {columns}"
        seen.add(spec.name)
    return seen


def test_every_file_of_the_retracted_tables_carries_the_lookup_bloom(conn, lake, tenant):
    """Drained appends, the claim MERGEs, a demote in a validated area (silver and curated),
    the writer's packing on the way, maintenance's Z-order and compaction: every live file of
    silver and curated carries a bloom filter on artifact_id and on nothing else; the
    other tables carry none."""
    small_batches(conn, lake, tenant, claims=6)
    seen = check_blooms(lake, tenant.tenant_id, "drained")
    assert {SILVER_CLAIMS.name, GOLD_CURATED.name} <= seen
    assert SILVER_CLAIMS.lookup_columns == ("artifact_id",) == GOLD_CURATED.lookup_columns
    zordered = maintenance.zorder(conn, lake, tenant.tenant_id)
    rewritten = {r.table for r in zordered if r.action == "rewrote"}
    assert SILVER_CLAIMS.name in rewritten
    check_blooms(lake, tenant.tenant_id, "z-ordered")
    small_batches(conn, lake, tenant, claims=4)
    maintenance.compact(conn, lake, tenant.tenant_id)
    check_blooms(lake, tenant.tenant_id, "drained again and compacted")


def test_a_lookup_passes_over_files_whose_statistics_admit_the_artifact(
    conn, lake, tenant, tmp_path
):
    """Three files of random artifact ids: each file's min/max spans nearly the whole range, so
    the statistics admit one artifact in all of them; the bloom filters leave only the file that
    holds it to be read. Every artifact id comes from one seeded generator, so whether a filter
    answers "maybe" for a value it does not hold (a few per cent of values) is the same on every
    run."""
    small_batches(conn, lake, tenant, claims=3)
    template = read_rows(lake.open(lake.table_uri(tenant.tenant_id, SILVER_CLAIMS)), SILVER_CLAIMS)
    rng = random.Random(7)
    first = dict(template[0], artifact_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)))
    uri = str(tmp_path / "claims")
    write_deltalake(
        uri,
        pa.Table.from_pylist([first], schema=SILVER_CLAIMS.schema),
        writer_properties=writer_properties(SILVER_CLAIMS),
    )
    table = lake.open(uri)
    for _ in range(3):
        append_claims(table, rng, 400)
        table.update_incremental()
    ids = sorted(r["artifact_id"] for r in read_rows(table, SILVER_CLAIMS))
    wanted = ids[len(ids) // 2]
    plan = pa.table(
        QueryBuilder()
        .register("t", table)
        .execute(
            f"EXPLAIN ANALYZE SELECT artifact_id FROM t WHERE {sql_in('artifact_id', [wanted])}"
        )
        .read_all()
    )
    text = "\n".join(plan.column("plan").to_pylist())
    stats = re.search(r"row_groups_pruned_statistics=(\d+) total → (\d+) matched", text)
    bloom = re.search(r"row_groups_pruned_bloom_filter=(\d+) total → (\d+) matched", text)
    assert stats and bloom, text
    assert int(stats.group(2)) >= 3, f"the statistics already ruled the files out: {text}"
    assert int(bloom.group(1)) == int(stats.group(2)) and int(bloom.group(2)) == 1, text
