"""The rows of a tenant's tables a batch's ops can touch, read before the fold: the silver rows
of the claims the ops name (and those a simulation's end or a validation reaches), the lineage
edges, the curated rows a retraction reaches, and the events bronze already holds."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from oml_dagster.lake.model.catalog import Op
from oml_dagster.lake.model.tables import (
    GOLD_CURATED,
    GOLD_LINEAGE,
    SILVER_CLAIMS,
    Key,
    Row,
    TableSpec,
)
from oml_dagster.lake.store.lookups import may_hold
from oml_dagster.lake.store.reads import query

_LIGHT = ("artifact_id", "version", "simulation_id", "sim_derived_ids", "workarea_id")


class RowLookup(Protocol):
    """Where the rows a batch touches are looked up (`OpenTables`: from a small table kept
    whole, or from the data files' match columns)."""

    def rows_with(
        self, table: DeltaTable, spec: TableSpec, matches: Mapping[str, Collection[str]]
    ) -> list[Row]: ...

    def whole_rows(self, table: DeltaTable, spec: TableSpec) -> list[Row] | None: ...


def matching_silver_keys(
    table: DeltaTable,
    *,
    sims: Collection[str],
    tainted: Collection[str],
    workareas: Collection[str],
    whole: list[Row] | None = None,
) -> set[Key]:
    """Keys of the silver rows a simulation end or a validation reads: rows of an ending
    simulation (`sims`), rows derived from a tainted one, rows of a validated workarea. Matched
    over Arrow columns file by file; only the matching keys become Python objects (the whole
    table's light columns as dicts grew a drain's memory with the table)."""

    def strings(values: Collection[str]) -> pa.Array:
        return pa.array(sorted(values), pa.string())

    if whole is not None:  # the table's every row, kept: matched row by row
        return {
            (r["artifact_id"], r["version"])
            for r in whole
            if r["simulation_id"] in sims
            or r["workarea_id"] in workareas
            or any(d in tainted for d in r["sim_derived_ids"] or ())
        }
    sims_in, tainted_in, workareas_in = strings(sims), strings(tainted), strings(workareas)
    fields = {name: SILVER_CLAIMS.schema.field(name).type for name in _LIGHT}
    keys: set[Key] = set()
    for fragment in table.to_pyarrow_dataset().get_fragments():
        # Cast first: a MERGE writes view types, which the kernels below do not all take.
        light = fragment.to_table(columns=list(_LIGHT))
        light = pa.table({name: pc.cast(light[name], kind) for name, kind in fields.items()})
        mask = pc.or_(
            pc.is_in(light["simulation_id"], value_set=sims_in),
            pc.is_in(light["workarea_id"], value_set=workareas_in),
        )
        found = [light.filter(pc.fill_null(mask, False))]
        if tainted:
            derived = light["sim_derived_ids"].combine_chunks()
            hit = pc.is_in(pc.list_flatten(derived), value_set=tainted_in)
            rows = pc.unique(pc.filter(pc.list_parent_indices(derived), pc.fill_null(hit, False)))
            found.append(light.take(rows))
        for part in found:
            keys.update(
                zip(part["artifact_id"].to_pylist(), part["version"].to_pylist(), strict=True)
            )
    return keys


@dataclass(frozen=True)
class TouchedRows:
    """Existing rows the batch's ops can touch, and the keys looked for (a key looked for and not
    found is new to the table: its row can be appended)."""

    silver: tuple[Row, ...] = ()
    silver_sought: frozenset[Key] = frozenset()
    lineage: tuple[Row, ...] = ()
    lineage_sought: frozenset[Key] = frozenset()
    curated: Mapping[str, tuple[Row, ...]] = field(default_factory=dict)


def touched_rows(
    *,
    ops: Sequence[Op],
    silver: DeltaTable | None,
    lineage: DeltaTable | None,
    curated: Mapping[str, DeltaTable],
    lookup: RowLookup,
) -> TouchedRows:
    """Every existing row the batch's `ops` can touch (through `lookup`, which keeps small
    tables whole and the data files' match columns between batches); `curated` maps each
    validated area to its table."""
    claim_keys = {
        (op.args["artifact_id"], op.args["version"]) for op in ops if op.name.startswith("claim.")
    }
    # Claim edges need their endpoints: the lake must hold both.
    claim_keys |= {
        (op.args[f"{end}_id"], op.args[f"{end}_version"])
        for op in ops
        if op.name == "edge.ratify" and op.args["graph"] == "claim"
        for end in ("src", "dst")
    }
    sims = {op.args["simulation_id"] for op in ops if op.name == "simulation.end"}
    tainted = {
        op.args["simulation_id"]
        for op in ops
        if op.name == "simulation.end" and op.args["demote_tainted"]
    }
    validations = {op.args["workarea_id"] for op in ops if op.name == "area.validate"}
    edge_ids = {op.args["edge_id"] for op in ops if op.name.startswith("edge.")}

    silver_rows: dict[Key, Row] = {}
    sought: set[Key] = set()
    if silver is not None:
        sought = set(claim_keys)
        if sims or validations:
            sought |= matching_silver_keys(
                silver,
                sims=sims,
                tainted=tainted,
                workareas=validations,
                whole=lookup.whole_rows(silver, SILVER_CLAIMS),
            )
        if sought:
            rows = lookup.rows_with(silver, SILVER_CLAIMS, {"artifact_id": {k[0] for k in sought}})
            for row in rows:
                key = (row["artifact_id"], row["version"])
                if key in sought:
                    silver_rows.setdefault(key, row)

    lineage_rows: list[Row] = []
    if lineage is not None and (edge_ids or sims):
        matches = {"edge_id": edge_ids, "simulation_id": sims}
        lineage_rows = lookup.rows_with(lineage, GOLD_LINEAGE, matches)

    # Curated rows a demote, erase or repair reaches: routed by the silver row's workarea.
    retracted = {
        (op.args["artifact_id"], op.args["version"])
        for op in ops
        if op.name in ("claim.demote", "claim.erase", "claim.repair")
    }
    curated_rows: dict[str, tuple[Row, ...]] = {}
    for workarea_id, table in curated.items():
        wanted = {
            k
            for k in retracted
            if k not in silver_rows or silver_rows[k]["workarea_id"] == workarea_id
        }
        if wanted:
            rows = lookup.rows_with(table, GOLD_CURATED, {"artifact_id": {k[0] for k in wanted}})
            curated_rows[workarea_id] = tuple(
                r for r in rows if (r["artifact_id"], r["version"]) in wanted
            )
    return TouchedRows(
        silver=tuple(silver_rows.values()),
        silver_sought=frozenset(sought),
        lineage=tuple(lineage_rows),
        lineage_sought=frozenset((e,) for e in edge_ids) if lineage is not None else frozenset(),
        curated=curated_rows,
    )


def held_events(bronze: DeltaTable | None, journal_seqs: list[int]) -> dict[int, tuple[str, bytes]]:
    """journal_seq -> (event_id, hash) of the events bronze holds between the least and the
    greatest of `journal_seqs`. Bronze is not queried when no data file's journal_seq range
    (the log's statistics) reaches theirs: a stream's new events lie above every file."""
    if bronze is None or not journal_seqs:
        return {}
    low, high = min(journal_seqs), max(journal_seqs)
    if not may_hold(bronze, "journal_seq", low=low, high=high):
        return {}
    held = query(
        bronze, "journal_seq, event_id, hash", f"journal_seq BETWEEN {low} AND {high}"
    ).to_pylist()
    return {r["journal_seq"]: (r["event_id"], r["hash"]) for r in held}
