"""`storage.rows_with`, the writer's lookup of the rows a batch touches: the same rows as a
filter over the whole table, from files written by appends and by MERGEs (view types), for any
set of keys — including more keys than an SQL IN list can carry (past about 25,000 values the
query engine overflowed the stack and the drain died with SIGSEGV)."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oml_dagster.lake.storage import Lake, read_rows, rows_with
from oml_dagster.lake.tables import BRONZE_EVENTS, GOLD_LINEAGE, writer_properties
from oml_dagster_tests.helpers import merge_rows


def _edges(n: int, simulation_id: str | None = None) -> list[dict]:
    rows = []
    for _ in range(n):
        row = {f.name: None for f in GOLD_LINEAGE.schema}
        for f in GOLD_LINEAGE.schema:
            if not f.nullable:
                t = f.type
                if pa.types.is_string(t):
                    row[f.name] = str(uuid.uuid4())
                elif pa.types.is_integer(t):
                    row[f.name] = 1
                elif pa.types.is_timestamp(t):
                    row[f.name] = 0
                elif pa.types.is_boolean(t):
                    row[f.name] = False
        row["simulation_id"] = simulation_id
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def lineage(tmp_path_factory):
    """A lineage table of 300 edges in several files, a third of them rewritten by a MERGE."""
    uri = str(tmp_path_factory.mktemp("rows-with") / "lineage")
    rows = _edges(100) + _edges(100, "sim-a") + _edges(100)
    props = writer_properties(GOLD_LINEAGE)
    for part in (rows[:100], rows[100:200], rows[200:]):
        data = pa.Table.from_pylist(part, schema=GOLD_LINEAGE.schema)
        write_deltalake(uri, data, mode="append", writer_properties=props)
    table = Lake(str(tmp_path_factory.getbasetemp())).open(uri)
    changed = [dict(r, state="demoted") for r in rows[50:150]]
    merge_rows(table, GOLD_LINEAGE, changed)
    return table, read_rows(table, GOLD_LINEAGE)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_the_rows_are_those_a_filter_over_the_whole_table_finds(lineage, data):
    table, everything = lineage
    edge_ids = [r["edge_id"] for r in everything]
    wanted = set(data.draw(st.lists(st.sampled_from(edge_ids), max_size=40)))
    wanted |= {str(uuid.uuid4()) for _ in range(data.draw(st.integers(0, 5)))}  # not there
    sims = set(data.draw(st.lists(st.sampled_from(["sim-a", "sim-b"]), max_size=2)))
    got = rows_with(table, GOLD_LINEAGE, {"edge_id": wanted, "simulation_id": sims})
    expected = [r for r in everything if r["edge_id"] in wanted or r["simulation_id"] in sims]
    key = lambda r: r["edge_id"]  # noqa: E731
    assert sorted(got, key=key) == sorted(expected, key=key)


def test_tens_of_thousands_of_keys_are_one_lookup(lineage):
    table, everything = lineage
    known = [r["edge_id"] for r in everything[:20]]
    wanted = {*known, *(str(uuid.uuid4()) for _ in range(40_000))}
    got = rows_with(table, GOLD_LINEAGE, {"edge_id": wanted})
    assert sorted(r["edge_id"] for r in got) == sorted(known)
    assert rows_with(table, GOLD_LINEAGE, {"edge_id": set()}) == []


def test_a_partitioned_table_is_refused(lineage):
    table, _ = lineage
    with pytest.raises(ValueError, match="bronze.events is partitioned"):
        rows_with(table, BRONZE_EVENTS, {"event_id": {"x"}})
