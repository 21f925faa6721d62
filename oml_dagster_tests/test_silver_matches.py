"""The writer's scan for the silver rows a `simulation.end` or an `area.validate` reads
(`touched.matching_silver_keys`): the same keys as a filter over the whole table's rows, for any
simulations, tainted simulations and workareas, from files written by appends and by MERGEs
(view types), with null and empty derivation lists."""

from __future__ import annotations

import datetime as dt
import uuid

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oml_dagster.lake.model.tables import SILVER_CLAIMS, writer_properties
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import read_rows
from oml_dagster.lake.write.touched import matching_silver_keys
from oml_dagster_tests.helpers import merge_rows

SIMS = ["sim-a", "sim-b", "sim-c"]
AREAS = ["area-1", "area-2", "area-3"]
DERIVED = [None, [], ["sim-a"], ["sim-b", "sim-c"], ["sim-c"]]


def _claims(n: int, seed: int) -> list[dict]:
    at = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    rows = []
    for i in range(n):
        k = seed * 1000 + i
        rows.append(
            {
                **{f.name: None for f in SILVER_CLAIMS.schema},
                **{
                    name: f"{name}-{k}"
                    for name in (
                        "tenant_id",
                        "claim_key",
                        "kind",
                        "workarea_path_at_write",
                        "writer_identity",
                        "principal",
                        "provenance",
                        "plaintext_digest",
                        "ciphertext_digest",
                        "body_ref",
                    )
                },
                "artifact_id": str(uuid.UUID(int=k + 1, version=4)),
                "version": 1 + k % 3,
                "state": "promoted",
                "workarea_id": AREAS[k % len(AREAS)],
                "simulation_id": [None, *SIMS][k % 4],
                "sim_derived_ids": DERIVED[k % len(DERIVED)],
                "created_at": at,
                "promoted_at": at,
                "applied_seq": k,
            }
        )
    return rows


@pytest.fixture(scope="module")
def silver(tmp_path_factory):
    """A silver table of 180 rows in three appended files, a third of its rows then rewritten by
    a MERGE (which writes view types)."""
    root = tmp_path_factory.mktemp("silver-matches")
    uri = str(root / "silver")
    props = writer_properties(SILVER_CLAIMS)
    parts = [_claims(60, seed) for seed in range(3)]
    for part in parts:
        data = pa.Table.from_pylist(part, schema=SILVER_CLAIMS.schema)
        write_deltalake(uri, data, mode="append", writer_properties=props)
    table = Lake(str(root)).open(uri)
    changed = [dict(r, state="demoted") for r in parts[0][30:] + parts[1][:30]]
    merge_rows(table, SILVER_CLAIMS, changed)
    return table, read_rows(table, SILVER_CLAIMS)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sims=st.sets(st.sampled_from([*SIMS, "sim-x"])),
    tainted=st.sets(st.sampled_from([*SIMS, "sim-x"])),
    areas=st.sets(st.sampled_from([*AREAS, "area-x"])),
)
def test_the_keys_are_those_a_filter_over_the_whole_table_finds(silver, sims, tainted, areas):
    table, everything = silver
    got = matching_silver_keys(table, sims=sims, tainted=tainted, workareas=areas)
    expected = {
        (r["artifact_id"], r["version"])
        for r in everything
        if r["simulation_id"] in sims
        or set(r["sim_derived_ids"] or ()) & tainted
        or r["workarea_id"] in areas
    }
    assert got == expected


def test_the_table_has_what_the_property_needs(silver):
    """The property above could pass on a table without the cases it is about."""
    table, everything = silver
    assert len(everything) == 180
    assert {r["state"] for r in everything} == {"promoted", "demoted"}
    derived = [r["sim_derived_ids"] for r in everything]
    assert None in derived and [] in derived and ["sim-b", "sim-c"] in derived
    # One file the MERGE wrote, one untouched append.
    assert len(table.file_uris()) == 2 and table.history(1)[0]["operation"] == "MERGE"
