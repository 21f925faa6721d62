"""A tenant's export (DESIGN "A tenant's departure"; ADR 0075): its five kinds of tables copied
as fresh Delta tables holding only the live version of each, plus a manifest, and the check of
an export against its manifest and its own journal chain, key-less.

An export copies the rows each table's live version reads, never its files: the copy has one
commit and the files that commit writes, so no log entry, superseded file or orphan of the lake
travels with it, and no ciphertext an erase removed from the live rows (a body erased lives on
only in files the live version no longer references, until VACUUM).

The target: `<target>/<tenant_id>/<table path>` (the lake's own layout, so the reconciler's
reads open it), `<target>/export-plan.json` (written first: the source version of every table,
so an interrupted export resumes on the same snapshot) and `<target>/manifest.json` (written
last: its presence is a finished export). Each table is written in one commit, so a table has
all of its rows or none: a resumed export keeps the tables that committed and writes the others
again from an empty directory, never a row twice.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import psycopg
import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Transaction, write_deltalake

from oml_dagster.lake import queries
from oml_dagster.lake.audit.reconcile import (
    CheckResult,
    LakeSnapshot,
    check_bodies,
    check_chain,
    check_erased,
    public_keys,
)
from oml_dagster.lake.errors import ExportTargetRefused, TenantPurged
from oml_dagster.lake.model.tables import (
    APP_ID,
    BRONZE_EVENTS,
    GOLD_CURATED,
    SILVER_CLAIMS,
    TableId,
    TableSpec,
    writer_properties,
)
from oml_dagster.lake.policy import DEFAULT_ERASURE_BOUND
from oml_dagster.lake.queries import tenant_scope
from oml_dagster.lake.store import conditional_put
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import conform, read_table, tenant_tables

PLAN = "export-plan.json"
MANIFEST = "manifest.json"
FORMAT = "oml-lake tenant export 1"
_CHUNK = 1 << 20


def _normalised(uri: str) -> str:
    """A URI as compared for nesting: an absolute local path, or `s3://bucket/key` (s3a too)."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme == "file" else uri
        return os.path.abspath(path).rstrip("/") + "/"
    scheme = "s3" if parsed.scheme in ("s3", "s3a") else parsed.scheme
    return f"{scheme}://{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/") + "/"


def refuse_inside_lake(lake: Lake, target: str) -> None:
    """Refuse a target that is the lake root, lies under it, or holds it: an export must never
    be written where the writer, maintenance or a purge reach."""
    root, there = _normalised(lake.root), _normalised(target)
    if there.startswith(root) or root.startswith(there):
        raise ExportTargetRefused(
            f"export target {target} lies under or over the lake root {lake.root}: export to a "
            "path or bucket prefix outside the lake"
        )


def target_filesystem(target: Lake, under: str = "") -> pafs.FileSystem:
    """The export target (or a directory of it) as a pyarrow filesystem."""
    uri = target.root.rstrip("/") + (f"/{under}" if under else "")
    if target.is_local:
        os.makedirs(target.local_path(uri), exist_ok=True)
    return target.filesystem(uri)


def list_objects(fs: pafs.FileSystem) -> dict[str, int]:
    """Every object under `fs`'s root: relative path -> size."""
    found: dict[str, int] = {}
    for info in fs.get_file_info(pafs.FileSelector("", recursive=True, allow_not_found=True)):
        if info.type == pafs.FileType.File:
            found[info.path.lstrip("/")] = info.size or 0
    return found


def _read_json(fs: pafs.FileSystem, path: str) -> dict[str, Any]:
    with fs.open_input_stream(path) as stream:
        loaded: dict[str, Any] = json.loads(stream.read())
    return loaded


def _write_json(target: Lake, path: str, value: dict[str, Any]) -> None:
    """`value` as the object `path` under the target's root, whole or not at all (a local file
    is renamed into place; an S3 PUT is atomic). Written with the store's own client: delta-rs's
    filesystem handler cannot write a stream."""
    data = json.dumps(value, indent=2, sort_keys=True).encode()
    if target.is_local:
        final = os.path.join(target.local_path(target.root), path)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        partial = f"{final}.{uuid.uuid4().hex}.partial"
        with open(partial, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, final)
        return
    parsed = urlparse(target.root)
    key = f"{parsed.path.strip('/')}/{path}".lstrip("/")
    conditional_put.s3_client(target).put_object(Bucket=parsed.netloc, Key=key, Body=data)


def sha256(fs: pafs.FileSystem, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open_input_stream(path) as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _relpath(lake: Lake, tenant_id: str, uri: str) -> str:
    return uri[len(lake.tenant_uri(tenant_id)) + 1 :]


def _live_rows(table: DeltaTable, spec: TableSpec) -> pa.RecordBatchReader:
    """The table's rows at its loaded version, batch by batch in the spec's types: a copy holds
    one batch in memory at a time, not the table."""
    found = QueryBuilder().register("t", table).execute("SELECT * FROM t")
    stream = pa.RecordBatchReader.from_stream(found)

    def conformed() -> Iterator[pa.RecordBatch]:
        for batch in stream:
            yield from conform(pa.Table.from_batches([batch]), spec).to_batches()

    return pa.RecordBatchReader.from_batches(spec.schema, conformed())


def _journal_head(table: DeltaTable) -> dict[str, Any]:
    """The last journal_seq of a bronze table's rows and its event hash (hex); zeros when none."""
    rows = read_table(table, BRONZE_EVENTS).select(["journal_seq", "hash"]).to_pylist()
    if not rows:
        return {"journal_seq": 0, "hash": bytes(32).hex()}
    last = max(rows, key=lambda r: r["journal_seq"])
    return {"journal_seq": last["journal_seq"], "hash": bytes(last["hash"]).hex()}


@dataclass
class ExportResult:
    manifest: dict[str, Any]
    # Tables this run wrote (the others were written by an earlier, interrupted run).
    written: list[str] = field(default_factory=list)
    resumed: bool = False


def _plan(conn: psycopg.Connection, lake: Lake, tenant_id: str) -> dict[str, Any]:
    """The snapshot an export copies: every table's live version and txn, fixed before the first
    table is written."""
    tables = []
    for table_id, _spec, uri in tenant_tables(lake, tenant_id):
        table = lake.open(uri)
        if table is None:
            continue
        tables.append(
            {
                "name": str(table_id),
                "path": _relpath(lake, tenant_id, uri),
                "source_version": table.version(),
                "txn_version": table.transaction_version(APP_ID) or 0,
            }
        )
    keys = public_keys(conn, tenant_id)
    return {
        "format": FORMAT,
        "tenant_id": tenant_id,
        "planned_at": dt.datetime.now(dt.UTC).isoformat(),
        "tables": tables,
        # Public keys only: what the key-less chain check needs, so an export verifies alone.
        "public_keys": {k: owner_key[1].hex() for k, owner_key in sorted(keys.items())},
    }


def export_tenant(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    target: Lake,
    *,
    after_table: Any = None,
) -> ExportResult:
    """Export `tenant_id`'s tables from `lake` to `target` (a `Lake` rooted at the target URI,
    with the options that reach it), or finish an interrupted export of the same tenant there.
    `after_table(name)` is called after each table commits (a crash seam for tests, progress
    for a caller)."""
    refuse_inside_lake(lake, target.root)
    with tenant_scope(conn, tenant_id):
        purged = conn.execute(queries.PURGE_ROW, (tenant_id,)).fetchone()
    if purged is not None:
        raise TenantPurged(
            f"tenant {tenant_id}: its purge started at {purged[2]:%Y-%m-%dT%H:%M:%SZ} "
            f"({purged[0]}); nothing of its lake is left to export"
        )
    target = target.checked()
    source = lake.for_tenant(tenant_id)
    fs = target_filesystem(target)
    present = list_objects(fs)
    if MANIFEST in present:
        manifest = _read_json(fs, MANIFEST)
        if manifest.get("tenant_id") != tenant_id:
            raise ExportTargetRefused(
                f"export target {target.root} holds the export of tenant "
                f"{manifest.get('tenant_id')}: choose an empty target"
            )
        return ExportResult(manifest, resumed=True)
    resumed = PLAN in present
    if resumed:
        plan = _read_json(fs, PLAN)
        if plan.get("tenant_id") != tenant_id or plan.get("format") != FORMAT:
            raise ExportTargetRefused(
                f"export target {target.root} holds an unfinished export of tenant "
                f"{plan.get('tenant_id')}: choose an empty target"
            )
        foreign = sorted(p for p in present if p != PLAN and not p.startswith(f"{tenant_id}/"))
    else:
        foreign = sorted(present)
    if foreign:
        raise ExportTargetRefused(
            f"export target {target.root} is not empty ({foreign[0]} and {len(foreign) - 1} more "
            "objects): export to an empty path or prefix"
        )
    if not resumed:
        plan = _plan(conn, source, tenant_id)
        _write_json(target, PLAN, plan)

    written: list[str] = []
    tables: list[dict[str, Any]] = []
    head: dict[str, Any] = {"journal_seq": 0, "hash": bytes(32).hex()}
    for entry in plan["tables"]:
        # The plan is JSON read back from the target: its names are parsed here, once.
        name, path = entry["name"], entry["path"]
        table_id = TableId.parse(name)
        spec = table_id.spec
        uri = f"{target.root.rstrip('/')}/{tenant_id}/{path}"
        copy = target.open(uri)
        if copy is None:
            # No commit: whatever an interrupted write left there is no table, only orphans.
            table_fs = target_filesystem(target, f"{tenant_id}/{path}")
            for leftover in list_objects(table_fs):
                table_fs.delete_file(leftover)
            where = source.table_uri(tenant_id, spec, table_id.workarea_id)
            original = source.open(where, version=entry["source_version"])
            assert original is not None  # a version the log no longer holds raises
            write_deltalake(
                uri,
                _live_rows(original, spec),
                mode="error",
                partition_by=list(spec.partition_by) or None,
                configuration=_configuration(spec),
                writer_properties=writer_properties(spec),
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(app_id=APP_ID, version=entry["txn_version"])]
                ),
                storage_options=target.storage_options or None,
            )
            written.append(name)
            copy = target.open(uri)
            assert copy is not None
        if after_table is not None:
            after_table(name)
        if spec is BRONZE_EVENTS:
            head = _journal_head(copy)
        table_fs = target.filesystem(uri)
        files = [
            {
                "path": f"{tenant_id}/{path}/{rel}",
                "bytes": size,
                "sha256": sha256(table_fs, rel),
            }
            for rel, size in sorted(list_objects(table_fs).items())
        ]
        tables.append(
            {
                **entry,
                "rows": copy.count(),
                "export_version": copy.version(),
                "files": files,
            }
        )
    manifest = {
        "format": FORMAT,
        "tenant_id": tenant_id,
        "exported_at": dt.datetime.now(dt.UTC).isoformat(),
        "planned_at": plan["planned_at"],
        "journal_head": head,
        "public_keys": plan["public_keys"],
        "tables": tables,
    }
    _write_json(target, MANIFEST, manifest)
    return ExportResult(manifest, written, resumed)


def _configuration(spec: TableSpec) -> dict[str, str | None]:
    """The copy's table properties: the lake's, so body columns get no statistics in its log."""
    config = spec.configuration(int(DEFAULT_ERASURE_BOUND.total_seconds()))
    return {k: v for k, v in config.items() if k == "delta.dataSkippingStatsColumns"}


# --- verify-export ------------------------------------------------------------------------------


@dataclass
class ExportCheck:
    """What `verify_export` found: one line per disagreement, naming the file or table."""

    target: str
    tenant_id: str | None = None
    files: int = 0
    tables: int = 0
    rows: int = 0
    journal_head: dict[str, Any] | None = None
    findings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "tenant_id": self.tenant_id,
            "ok": self.ok,
            "files": self.files,
            "tables": self.tables,
            "rows": self.rows,
            "journal_head": self.journal_head,
            "findings": self.findings,
        }


def verify_export(target: Lake) -> ExportCheck:
    """Check an export against its manifest (every file's size and SHA-256, no file unlisted,
    each table's one commit, rows and txn version) and against itself, key-less: the journal
    chain of the exported bronze under the manifest's public keys (the reconciler's check), its
    head as the manifest states it, and the exported claims' bodies against their digests."""
    check = ExportCheck(target.root)
    fs = target_filesystem(target) if target.is_local else target.filesystem(target.root)
    present = list_objects(fs)
    if MANIFEST not in present:
        what = "an unfinished export (resume it)" if PLAN in present else "no export"
        check.findings.append(f"{MANIFEST}: missing; {target.root} holds {what}")
        return check
    manifest = _read_json(fs, MANIFEST)
    tenant_id = str(manifest.get("tenant_id"))
    check.tenant_id = tenant_id
    listed: set[str] = set()
    for table in manifest.get("tables", []):
        check.tables += 1
        for f in table["files"]:
            listed.add(f["path"])
            check.files += 1
            if f["path"] not in present:
                check.findings.append(f"{f['path']}: listed in the manifest, missing")
            elif present[f["path"]] != f["bytes"]:
                check.findings.append(
                    f"{f['path']}: {present[f['path']]} bytes, the manifest says {f['bytes']}"
                )
            elif sha256(fs, f["path"]) != f["sha256"]:
                check.findings.append(f"{f['path']}: SHA-256 differs from the manifest's")
        uri = f"{target.root.rstrip('/')}/{tenant_id}/{table['path']}"
        try:
            copy = DeltaTable(uri, storage_options=target.storage_options or None)
        except Exception as error:  # any unreadable table is a finding, not a crash
            check.findings.append(f"{table['name']}: does not open as a Delta table ({error})")
            continue
        rows = copy.count()
        check.rows += rows
        if copy.version() != table["export_version"]:
            check.findings.append(
                f"{table['name']}: version {copy.version()}, the manifest says "
                f"{table['export_version']} (an export holds one commit per table)"
            )
        if rows != table["rows"]:
            check.findings.append(
                f"{table['name']}: {rows} rows, the manifest says {table['rows']}"
            )
        txn = copy.transaction_version(APP_ID) or 0
        if txn != table["txn_version"]:
            check.findings.append(
                f"{table['name']}: txn version {txn}, the manifest says {table['txn_version']}"
            )
    extra = sorted(p for p in present if p not in listed and p not in (MANIFEST, PLAN))
    for path in extra:
        check.findings.append(f"{path}: not listed in the manifest")
    if check.findings:
        return check
    snapshot = LakeSnapshot(target, tenant_id)
    keys = {k: (tenant_id, bytes.fromhex(v)) for k, v in manifest.get("public_keys", {}).items()}
    results: list[CheckResult] = [
        check_chain(snapshot, keys),
        check_erased(snapshot, SILVER_CLAIMS),
        check_erased(snapshot, GOLD_CURATED),
        check_bodies(snapshot),
    ]
    for result in results:
        check.findings.extend(f"{result.table} {result.name}: {line}" for line in result.samples())
    bronze = snapshot.one(BRONZE_EVENTS)
    head = _journal_head(bronze.table) if bronze else {"journal_seq": 0, "hash": bytes(32).hex()}
    check.journal_head = head
    if head != manifest.get("journal_head"):
        check.findings.append(
            f"journal head: exported bronze ends at {head}, the manifest says "
            f"{manifest.get('journal_head')}"
        )
    return check
