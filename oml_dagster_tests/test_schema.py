"""The column-level schema of every table equals the spec: names, order, Delta and Arrow types,
nullability and partitioning, both as declared and as written to Delta by a drain.

The spec is read from docs/spec/delta-tables.txt, a copy of the contract kept in the repository;
when the shared contract is beside the checkout, the copy must equal it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from oml_dagster.lake import queries
from oml_dagster.lake.model import tables
from oml_dagster.lake.model.tables import (
    BRONZE_EVENTS,
    GOLD_AREAS,
    GOLD_CURATED,
    GOLD_LINEAGE,
    SILVER_CLAIMS,
    TableId,
    TableSpec,
)
from oml_dagster.simulate import acts
from oml_dagster_tests.helpers import drain_all, make_tree, new_id, promoted

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "docs" / "spec" / "delta-tables.txt"
SHARED = ROOT.parent / "shared" / "spec" / "delta-tables.txt"

ARROW = {
    "utf8": pa.string(),
    "int64": pa.int64(),
    "binary": pa.binary(),
    "timestamp[µs, UTC]": pa.timestamp("us", tz="UTC"),
    "date32": pa.date32(),
}


HEADINGS = ("bronze.events", "silver.claims", "gold.lineage", "gold.areas", "gold.curated_<table>")


def _rows_by_heading(text: str) -> dict[str, list[str]]:
    """The raw column rows (tab-separated lines) under each table heading of `text`, the header
    row left out; a table ends at the first other line that is not blank."""
    rows: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line in HEADINGS:
            current = line
            rows[current] = []
        elif current and line.count("\t") >= 3 and not line.startswith("Column\t"):
            rows[current].append(line)
        elif current and rows[current] and line.strip():
            current = None
    return rows


def spec_columns() -> dict[str, list[tuple[str, str, str, bool]]]:
    """Per table heading: (column, Delta type, Arrow type, nullable) rows of the spec."""
    return {
        heading: [
            (name, delta, arrow, null == "yes")
            for name, delta, arrow, null, *_ in (row.split("\t") for row in rows)
            if null in ("yes", "no")
        ]
        for heading, rows in _rows_by_heading(SPEC.read_text()).items()
    }


def _expected_type(delta: str, arrow: str, column: str) -> pa.DataType:
    if arrow in ARROW:
        return ARROW[arrow]
    if delta == "ARRAY<STRING>":
        return pa.list_(pa.field("element", pa.string(), nullable=False))
    if delta == "ARRAY<STRUCT>" and column == "attachments":
        return pa.list_(
            pa.field(
                "element",
                pa.struct(
                    [
                        pa.field("plaintext_digest", pa.string(), nullable=False),
                        pa.field("ciphertext_digest", pa.string(), nullable=False),
                        pa.field("media_type", pa.string(), nullable=False),
                        pa.field("size_bytes", pa.int64(), nullable=False),
                    ]
                ),
                nullable=False,
            )
        )
    raise AssertionError(f"unmapped spec type {delta}/{arrow} for {column}")


def expected_schema(heading: str) -> pa.Schema:
    rows = spec_columns()[heading]
    if heading == "gold.curated_<table>":
        rows = spec_columns()["silver.claims"] + rows
    return pa.schema(
        [pa.field(n, _expected_type(d, a, n), nullable=null) for n, d, a, null in rows]
    )


CASES = [
    ("bronze.events", BRONZE_EVENTS, ["event_date"]),
    ("silver.claims", SILVER_CLAIMS, []),
    ("gold.lineage", GOLD_LINEAGE, []),
    ("gold.areas", GOLD_AREAS, []),
    ("gold.curated_<table>", GOLD_CURATED, []),
]


def test_the_repository_copy_of_the_spec_is_the_contract():
    if not SHARED.exists():
        pytest.skip("the shared contract is not beside this checkout")
    assert SPEC.read_text() == SHARED.read_text()


def test_the_spec_parses_to_every_column():
    counts = {k: len(v) for k, v in spec_columns().items()}
    assert counts == {
        "bronze.events": 19,
        "silver.claims": 24,
        "gold.lineage": 15,
        "gold.areas": 11,
        "gold.curated_<table>": 1,
    }


def test_the_column_file_holds_the_spec_rows_verbatim():
    ours = (ROOT / "oml_dagster" / "lake" / "model" / "columns.tsv").read_text(encoding="utf-8")
    assert _rows_by_heading(ours) == _rows_by_heading(SPEC.read_text())


def test_a_column_row_the_reader_cannot_type_is_refused_by_line_and_name():
    text = "silver.claims\nartifact_id\tSTRING\tutf8\tno\tok\nversion\tLONG\tint32\tno\tbad"
    with pytest.raises(ValueError, match=r"line 3: cannot read column 'version'"):
        tables.read_columns(text)
    with pytest.raises(ValueError, match=r"line 2: cannot read column 'a'"):
        tables.read_columns("silver.claims\na\tSTRING\tutf8\tmaybe")
    with pytest.raises(ValueError, match=r"line 2: cannot read column 'b'"):
        tables.read_columns("silver.claims\nb\tSTRING")  # a row cut short
    parsed = tables.read_columns(text.replace("int32", "int64"))
    assert [(f.name, f.type, f.nullable, m) for f, m in parsed["silver.claims"]] == [
        ("artifact_id", pa.string(), False, "ok"),
        ("version", pa.int64(), False, "bad"),
    ]


def test_each_column_carries_the_spec_meaning():
    meanings = {n: m for n, _, _, _, m in spec_rows_with_meaning("silver.claims")}
    assert SILVER_CLAIMS.meanings == meanings
    assert GOLD_CURATED.meanings == {**meanings, "curated_at": GOLD_CURATED.meanings["curated_at"]}
    assert GOLD_CURATED.meanings["curated_at"].startswith("When the validation batch")
    assert GOLD_LINEAGE.meanings["proposed_at"] == ""  # the spec states none


def spec_rows_with_meaning(heading: str) -> list[tuple[str, ...]]:
    rows = _rows_by_heading(SPEC.read_text())[heading]
    return [tuple((r.split("\t") + [""])[:5]) for r in rows]


@pytest.mark.parametrize("heading,spec,partitions", CASES, ids=[c[0] for c in CASES])
def test_declared_schema_equals_the_spec(heading, spec: TableSpec, partitions):
    assert spec.schema.equals(expected_schema(heading)), (spec.schema, expected_schema(heading))
    assert list(spec.partition_by) == partitions


@pytest.mark.parametrize("heading,spec,partitions", CASES, ids=[c[0] for c in CASES])
def test_written_tables_equal_the_spec(conn, lake, tenant, heading, spec: TableSpec, partitions):
    tree = make_tree(conn, tenant)
    c = promoted(conn, tenant, tree.a, sim_derived_ids=None)
    acts.ratify(conn, tenant, acts.Edge(new_id(), c.artifact_id, c.artifact_id, dst_version=1))
    acts.upsert_area(conn, tenant, tree.a, status="committed")
    acts.validate_area(conn, tenant, tree.a)
    acts.demote(conn, tenant, c)  # MERGE rewrites too
    drain_all(conn, lake)
    workarea = tree.a if spec is GOLD_CURATED else None
    table = lake.open(lake.table_uri(tenant.tenant_id, spec, workarea))
    written = pa.schema(table.schema().to_arrow())
    expected = expected_schema(heading)
    assert written.names == expected.names
    for field in expected:
        got = written.field(field.name)
        assert got.nullable == field.nullable, field.name
        assert got.type.equals(field.type), (field.name, got.type, field.type)
    assert table.metadata().partition_columns == partitions


def test_a_table_id_is_the_name_the_frontier_cache_and_the_run_metadata_store():
    workarea = "00000000-0000-4000-8000-000000000001"
    assert str(TableId(SILVER_CLAIMS.name)) == "silver.claims"
    assert str(TableId.curated(workarea)) == f"gold.curated/{workarea}"
    for spec in (BRONZE_EVENTS, SILVER_CLAIMS, GOLD_LINEAGE, GOLD_AREAS):
        assert TableId.parse(spec.name) == TableId(spec.name)
    parsed = TableId.parse(f"gold.curated/{workarea}")
    assert (parsed.spec_name, parsed.workarea_id) == (GOLD_CURATED.name, workarea)
    # The statements that leave curated tables out of a tenant's drained frontier match the
    # curated names by their prefix.
    prefix = f"NOT LIKE '{GOLD_CURATED.name}/%%'"
    assert prefix in queries.PENDING_TENANTS and prefix in queries.TENANT_LAGS
