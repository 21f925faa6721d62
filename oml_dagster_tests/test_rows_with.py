"""`lookups.rows_with`, the writer's lookup of the rows a batch touches: the same rows as a
filter over the whole table, from files written by appends and by MERGEs (view types), for any
set of keys — including more keys than an SQL IN list can carry (past about 25,000 values the
query engine overflowed the stack and the drain died with SIGSEGV)."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import ColumnProperties, WriterProperties, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oml_dagster.lake.model.tables import BRONZE_EVENTS, GOLD_LINEAGE, writer_properties
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.lookups import FileKeys, may_hold, may_hold_any, rows_with
from oml_dagster.lake.store.reads import read_rows
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


def test_kept_match_columns_answer_as_a_fresh_read_across_merges(tmp_path):
    """A drain's `FileKeys` keeps each file's match columns between lookups: a lookup after a
    MERGE (new files, old ones removed) reads only the files added since and finds what a
    lookup with nothing kept finds; the kept columns never pass their bound."""
    uri = str(tmp_path / "lineage")
    rows = _edges(60) + _edges(60, "sim-a")
    props = writer_properties(GOLD_LINEAGE)
    for part in (rows[:40], rows[40:80], rows[80:]):
        write_deltalake(
            uri,
            pa.Table.from_pylist(part, schema=GOLD_LINEAGE.schema),
            mode="append",
            writer_properties=props,
        )
    table = Lake(str(tmp_path)).open(uri)
    keys = FileKeys(most_bytes=1 << 20)
    ids = [r["edge_id"] for r in rows]
    matches = {"edge_id": set(ids[::7]), "simulation_id": {"sim-a"}}

    first = keys.rows_with(table, GOLD_LINEAGE, matches)
    assert keys.read == 3
    assert sorted(r["edge_id"] for r in first) == sorted(
        r["edge_id"] for r in rows if r["edge_id"] in matches["edge_id"] or r["simulation_id"]
    )
    assert keys.rows_with(table, GOLD_LINEAGE, matches) == first
    assert keys.read == 3  # nothing read again

    merge_rows(table, GOLD_LINEAGE, [dict(r, state="demoted") for r in rows[:10]])
    table.update_incremental()
    files_after = len(table.file_uris())
    got = keys.rows_with(table, GOLD_LINEAGE, matches)
    assert sorted(got, key=lambda r: r["edge_id"]) == sorted(
        rows_with(table, GOLD_LINEAGE, matches), key=lambda r: r["edge_id"]
    )
    assert {r["edge_id"] for r in got if r["state"] == "demoted"} == {
        r["edge_id"] for r in rows[:10] if r["edge_id"] in matches["edge_id"]
    }
    assert 1 <= keys.read - 3 <= files_after - 2  # the MERGE's new file(s) only

    small = FileKeys(most_bytes=4_000)  # room for one file's edge ids, not three
    for _ in range(3):
        assert len(small.rows_with(table, GOLD_LINEAGE, matches)) == len(got)
        assert small._bytes <= 4_000


@pytest.fixture(scope="module")
def seq_files(tmp_path_factory):
    """A table of three files whose `applied_seq` values are known: 10-19, 40-44 and 100."""
    uri = str(tmp_path_factory.mktemp("may-hold") / "lineage")
    files = [list(range(10, 20)), list(range(40, 45)), [100]]
    for values in files:
        rows = [dict(r, applied_seq=v) for r, v in zip(_edges(len(values)), values, strict=True)]
        write_deltalake(uri, pa.Table.from_pylist(rows, schema=GOLD_LINEAGE.schema), mode="append")
    return Lake(str(tmp_path_factory.getbasetemp())).open(uri), files


@settings(max_examples=60, deadline=None)
@given(low=st.integers(0, 110), span=st.integers(0, 30))
def test_may_hold_is_false_only_when_no_file_can_hold_the_range(seq_files, low, span):
    """The writer skips its bronze query for a batch's journal_seqs when `may_hold` says no
    file reaches them: it must say yes whenever a row lies in the range."""
    table, files = seq_files
    high = low + span
    reaches = any(min(v) <= high and max(v) >= low for v in files)
    assert may_hold(table, "applied_seq", low=low, high=high) == reaches
    if any(low <= x <= high for v in files for x in v):
        assert may_hold(table, "applied_seq", low=low, high=high)


def test_a_file_without_statistics_may_hold_any_range(tmp_path):
    """A file whose log entry has no min/max (written without statistics) cannot rule a range
    out: `may_hold` says yes, so the writer queries bronze rather than miss a replay."""
    uri = str(tmp_path / "lineage")
    rows = [dict(r, applied_seq=5) for r in _edges(3)]
    no_stats = WriterProperties(
        default_column_properties=ColumnProperties(statistics_enabled="NONE")
    )
    data = pa.Table.from_pylist(rows, schema=GOLD_LINEAGE.schema)
    write_deltalake(uri, data, mode="append", writer_properties=no_stats)
    table = Lake(str(tmp_path)).open(uri)
    assert may_hold(table, "applied_seq", low=1_000, high=2_000)


def _edge_ids_table(uri: str, files: list[list[str]], props=None):
    """A lineage table with one data file per list of edge ids."""
    for ids in files:
        rows = [dict(r, edge_id=e) for r, e in zip(_edges(len(ids)), ids, strict=True)]
        data = pa.Table.from_pylist(rows, schema=GOLD_LINEAGE.schema)
        write_deltalake(uri, data, mode="append", writer_properties=props)
    return Lake(str(uri)).open(uri)


# Long ids over a small alphabet: prefixes shared past the 64 characters delta-rs keeps of a
# string's statistics, so the log's min and max are truncated.
_LONG_IDS = st.text(alphabet="ab~", min_size=60, max_size=90)


@settings(max_examples=25, deadline=None)
@given(
    files=st.lists(st.lists(_LONG_IDS, min_size=1, max_size=6), min_size=1, max_size=4),
    extra=st.lists(_LONG_IDS, max_size=4),
    pick=st.data(),
)
def test_statistics_never_pass_over_a_file_that_holds_a_value(tmp_path_factory, files, extra, pick):
    """`may_hold_any` rules a file out only when no wanted value can be in it, whatever the
    strings (long ones' statistics are truncated), and the lookup that relies on it finds
    exactly what a filter over the whole table finds."""
    uri = str(tmp_path_factory.mktemp("stats") / "lineage")
    table = _edge_ids_table(uri, files)
    stored = [e for ids in files for e in ids]
    wanted = set(pick.draw(st.lists(st.sampled_from(stored), max_size=3))) | set(extra)
    actions = pa.table(table.get_add_actions(flatten=True))
    by_path = dict(
        zip(actions["path"].to_pylist(), may_hold_any(actions, {"edge_id": wanted}), strict=True)
    )
    for path in by_path:
        held = set(_edge_ids_of_file(uri, path)) & wanted
        if held:
            assert by_path[path], (path, held)
    keys = FileKeys()
    got = keys.rows_with(table, GOLD_LINEAGE, {"edge_id": wanted})
    assert sorted(r["edge_id"] for r in got) == sorted(e for e in stored if e in wanted)


def _edge_ids_of_file(uri: str, path: str) -> list[str]:
    return pq.read_table(f"{uri}/{path}", columns=["edge_id"])["edge_id"].to_pylist()


def test_statistics_pass_over_files_whose_range_misses_every_value(tmp_path):
    """Three files with disjoint ranges of ids: a lookup of ids from one of them reads that
    file's match columns only; a file written without statistics is always read."""
    uri = str(tmp_path / "lineage")
    table = _edge_ids_table(uri, [["a1", "a2"], ["m1", "m2"], ["x1", "x2"]])
    keys = FileKeys()
    got = keys.rows_with(table, GOLD_LINEAGE, {"edge_id": {"m2", "n0"}})
    assert [r["edge_id"] for r in got] == ["m2"]
    assert (keys.read, keys.skipped) == (1, 2)

    no_stats = WriterProperties(
        default_column_properties=ColumnProperties(statistics_enabled="NONE")
    )
    table = _edge_ids_table(uri, [["q1"]], props=no_stats)
    keys = FileKeys()
    assert keys.rows_with(table, GOLD_LINEAGE, {"edge_id": {"m2", "q1"}})
    assert (keys.read, keys.skipped) == (2, 2)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_lookup_answered_by_a_query_finds_what_the_files_find(lineage, data):
    """A lookup of few values over many unread rows goes to the query engine: the same rows as
    reading the files' match columns, quotes in values included."""
    table, everything = lineage
    edge_ids = [r["edge_id"] for r in everything]
    wanted = set(data.draw(st.lists(st.sampled_from(edge_ids), max_size=40)))
    wanted |= set(data.draw(st.lists(st.sampled_from(["it's", "x'); DROP", "q"]), max_size=2)))
    sims = set(data.draw(st.lists(st.sampled_from(["sim-a", "sim-b", "o'b"]), max_size=2)))
    matches = {"edge_id": wanted, "simulation_id": sims}
    queried = FileKeys()
    queried.QUERY_FROM_ROWS = queried.QUERY_ROWS_PER_VALUE = 0
    got = queried.rows_with(table, GOLD_LINEAGE, matches)
    assert queried.queried == (1 if wanted or sims else 0) and queried.read == 0
    read = FileKeys()
    key = lambda r: r["edge_id"]  # noqa: E731
    assert sorted(got, key=key) == sorted(read.rows_with(table, GOLD_LINEAGE, matches), key=key)
    assert read.queried == 0


def test_a_lookup_goes_to_a_query_only_for_few_values_over_many_unread_rows(lineage):
    """The choice between a query and reading match columns: few values and many rows not
    kept go to the query; many values, or rows whose columns are kept, are read."""
    table, everything = lineage
    # An edge id inside every file's min/max, so the statistics leave all 300 rows unread: the
    # ids are random, and one outside a file's range (about 1 in 100 a file) left 200.
    files = pa.table(table.get_add_actions(flatten=True))
    inside = next(
        r["edge_id"] for r in everything if all(may_hold_any(files, {"edge_id": [r["edge_id"]]}))
    )
    few = {"edge_id": {inside}}
    keys = FileKeys(most_bytes=1 << 20)
    keys.QUERY_FROM_ROWS, keys.QUERY_ROWS_PER_VALUE = 250, 10
    assert len(keys.rows_with(table, GOLD_LINEAGE, few)) == 1
    assert (keys.queried, keys.read) == (1, 0)  # 300 rows unread >= 250 + 10
    many = {"edge_id": {r["edge_id"] for r in everything[:10]}}
    assert len(keys.rows_with(table, GOLD_LINEAGE, many)) == 10
    assert keys.queried == 1 and keys.read > 0  # 300 < 250 + 100: read and kept
    assert len(keys.rows_with(table, GOLD_LINEAGE, few)) == 1
    assert keys.queried == 1  # the kept columns answer now
    fresh = FileKeys()
    fresh.QUERY_FROM_ROWS = fresh.QUERY_ROWS_PER_VALUE = fresh.QUERY_MOST_VALUES = 0
    assert len(fresh.rows_with(table, GOLD_LINEAGE, few)) == 1
    assert fresh.queried == 0  # no query past QUERY_MOST_VALUES


def test_a_file_missing_either_bound_or_the_column_s_statistics_may_hold_anything():
    """A file whose min or max is absent (a string too long to truncate upward has no max), or
    a table whose log keeps no statistics of the column, rules nothing out."""
    actions = pa.table(
        {
            "path": ["a", "b", "c", "d"],
            "min.edge_id": ["a", None, "m", None],
            "max.edge_id": [None, "c", "n", None],
        }
    )
    assert may_hold_any(actions, {"edge_id": {"x"}}) == [True, True, False, True]
    assert may_hold_any(actions, {"edge_id": {"b"}}) == [True, True, False, True]
    assert may_hold_any(actions, {"edge_id": set()}) == [False] * 4
    assert may_hold_any(actions, {"simulation_id": {"x"}}) == [True] * 4
