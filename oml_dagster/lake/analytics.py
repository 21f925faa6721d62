"""Lake analytics: the questions the lake exists to answer (spec: "lineage and metadata analytics",
"event analytics, lag and volume studies", "what was the tree on date X is a bronze replay"),
read with DuckDB and its Delta extension.

DuckDB reads Delta through delta-kernel, an implementation independent of the writer's delta-rs,
so every analytics read doubles as a check that the lake is readable by a second implementation
(`second_reader_check` compares its row counts with the Delta log's). Nothing here decrypts:
bodies stay ciphertext, and no question asks for them.

One DuckDB connection serves one tenant (`tenant_connection`): the tenant's tables are views named
`bronze_events`, `silver_claims`, `gold_lineage`, `gold_areas` and `curated_<workarea_id with '-'
replaced by '_'>`; a table that does not exist yet is an empty table of the spec's columns, so
every question has an answer. Locked down (`lockdown=True`, what the SQL shell uses), the
connection can read files only under the tenant's prefix, cannot change its configuration, and
`run_query` accepts only queries over those views (`RefusedQuery` otherwise).

Why one file (769 lines): every analytics read and the SQL shell go through the same DuckDB connection
and its per-tenant sandbox (allowed directories, external access off, configuration locked);
keeping them together keeps every query inside that sandbox.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import duckdb
import psycopg
import pyarrow as pa

from oml_dagster.lake import queries
from oml_dagster.lake.errors import LakeError
from oml_dagster.lake.model.tables import (
    APP_ID,
    CORE_TABLES,
    GOLD_CURATED,
    TableId,
    TableSpec,
    area_descendants,
)
from oml_dagster.lake.queries import tenant_scope
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import tenant_tables

# View name of each core table in a tenant's DuckDB connection.
VIEW_OF: dict[str, str] = {spec.name: spec.name.replace(".", "_") for spec in CORE_TABLES}
CURATED_VIEW_PREFIX = "curated_"

# Table functions a query may call: generators only, none of them reads anything.
ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class AnalyticsError(LakeError):
    """The analytics engine could not be set up (e.g. the Delta extension is not installed)."""


class RefusedQuery(LakeError):
    """A query the SQL shell will not run: a write, a setting, or a read outside the tenant's
    views. `reason` names what was refused."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# --- the engine ----------------------------------------------------------------------------------


def extension_path(name: str = "delta") -> str:
    """The DuckDB extension file `name` shipped by the `duckdb-ext-<name>` package (nothing is
    downloaded): `delta` always, `httpfs` for lakes on S3."""
    package = f"duckdb-ext-{name}"
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise AnalyticsError(f"the {package} package is not installed") from None
    version = f"v{duckdb.__version__}"
    for file in dist.files or ():
        if file.name == f"{name}.duckdb_extension" and version in file.parts:
            return str(dist.locate_file(file))
    raise AnalyticsError(f"{package} ships no {name} extension for DuckDB {duckdb.__version__}")


def curated_view(workarea_id: str) -> str:
    """`curated_<workarea_id>` with '-' as '_': a plain SQL identifier, no quoting needed."""
    return CURATED_VIEW_PREFIX + workarea_id.replace("-", "_")


@dataclass(frozen=True)
class TenantView:
    """One registered view: its name, the lake table it shows, and the table's URI (None when
    the table does not exist yet and the view is an empty table of the spec's columns)."""

    view: str
    table: str
    spec: TableSpec
    uri: str | None


@dataclass
class TenantConnection:
    tenant_id: str
    con: duckdb.DuckDBPyConnection
    views: dict[str, TenantView] = field(default_factory=dict)
    locked: bool = False

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> TenantConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rows(self, sql: str, params: list | None = None) -> list[dict[str, Any]]:
        """Rows of a query of this module's own (not user input) as dicts."""
        return _dicts(self.con.execute(sql, params or []))


def _dicts(result: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    names = [d[0] for d in result.description or ()]
    return [dict(zip(names, row, strict=True)) for row in result.fetchall()]


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _s3_secret(options: dict[str, str]) -> str | None:
    """A DuckDB S3 secret from the lake's storage options (the same ones delta-rs gets)."""
    opts = {k.upper(): str(v) for k, v in options.items()}
    parts = ["TYPE s3", "URL_STYLE 'path'"]
    for option, param in (
        ("AWS_ACCESS_KEY_ID", "KEY_ID"),
        ("AWS_SECRET_ACCESS_KEY", "SECRET"),
        ("AWS_SESSION_TOKEN", "SESSION_TOKEN"),
        ("AWS_REGION", "REGION"),
    ):
        if opts.get(option):
            parts.append(f"{param} {_sql_string(opts[option])}")
    endpoint = opts.get("AWS_ENDPOINT_URL") or opts.get("AWS_ENDPOINT")
    if endpoint:
        url = urlparse(endpoint)
        parts.append(f"ENDPOINT {_sql_string(url.netloc or url.path)}")
        use_ssl = url.scheme != "http" and opts.get("AWS_ALLOW_HTTP", "").lower() != "true"
        parts.append(f"USE_SSL {'true' if use_ssl else 'false'}")
    return f"CREATE SECRET oml_lake ({', '.join(parts)})"


def tenant_connection(lake: Lake, tenant_id: str, *, lockdown: bool = False) -> TenantConnection:
    """A DuckDB connection with the tenant's tables as views (see the module docstring).

    With `lockdown`, file access is limited to the tenant's prefix, external access (extension
    loading, other files, COPY, ATTACH) is off, and the configuration is locked. DuckDB signs
    with the tenant's own credentials when it has them (`Lake.for_tenant`)."""
    lake = lake.for_tenant(tenant_id)
    try:
        con = duckdb.connect(
            ":memory:",
            config={
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
            },
        )
    except duckdb.Error as error:  # pragma: no cover - DuckDB itself broken
        raise AnalyticsError(f"DuckDB: {error}") from error
    found = TenantConnection(tenant_id, con)
    try:
        con.execute(f"LOAD {_sql_string(extension_path('delta'))}")
        if not lake.is_local:
            con.execute(f"LOAD {_sql_string(extension_path('httpfs'))}")
            con.execute(_s3_secret(lake.storage_options))
        existing = {name: (spec, uri) for name, spec, uri in tenant_tables(lake, tenant_id)}
        for spec in CORE_TABLES:
            spec_uri = existing.get(spec.name)
            _register(found, VIEW_OF[spec.name], spec.name, spec, spec_uri[1] if spec_uri else None)
        for name, (spec, uri) in sorted(existing.items()):
            if spec is GOLD_CURATED:
                workarea_id = TableId.parse(name).workarea_id
                _register(found, curated_view(workarea_id), name, spec, uri)
        if lockdown:
            prefix = lake.tenant_uri(tenant_id).rstrip("/") + "/"
            con.execute(f"SET allowed_directories = [{_sql_string(prefix)}]")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
            found.locked = True
    except BaseException:
        con.close()
        raise
    return found


def _register(
    found: TenantConnection, view: str, table: str, spec: TableSpec, uri: str | None
) -> None:
    con = found.con
    if uri is None:
        # No table yet: an empty table of the spec's columns answers every question with nothing.
        con.register("oml_empty", spec.schema.empty_table())
        con.execute(f"CREATE TABLE {view} AS SELECT * FROM oml_empty")
        con.unregister("oml_empty")
    else:
        con.execute(f"CREATE VIEW {view} AS SELECT * FROM delta_scan({_sql_string(uri)})")
    found.views[view] = TenantView(view, table, spec, uri)


# --- the SQL shell's guard -----------------------------------------------------------------------


def check_query(tc: TenantConnection, sql: str) -> None:
    """Refuse anything but read-only queries over the tenant's views: one or more SELECTs (SHOW,
    DESCRIBE and SUMMARIZE are SELECTs), no table function but a generator, no file path as a
    table. The lockdown of the connection is the second line behind this one."""
    try:
        statements = tc.con.extract_statements(sql)
    except duckdb.Error as error:
        raise RefusedQuery(f"cannot parse the query: {error}") from None
    if not statements:
        raise RefusedQuery("empty query")
    for statement in statements:
        if statement.type != duckdb.StatementType.SELECT:
            kind = statement.type.name
            raise RefusedQuery(f"{kind} statements are refused: the lake is read-only here")
        text = statement.query
        tree = json.loads(tc.con.execute("SELECT json_serialize_sql(?)", [text]).fetchone()[0])
        if tree.get("error"):
            raise RefusedQuery(f"only plain queries are accepted: {tree.get('error_message')}")
        _check_tree(tree)


def _check_tree(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _check_tree(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "TABLE_FUNCTION":
        function = node.get("function") or {}
        name = str(function.get("function_name", "")).lower()
        if name not in ALLOWED_TABLE_FUNCTIONS:
            raise RefusedQuery(
                f"table function {name}() is refused: query the tenant's views "
                f"(allowed table functions: {', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))})"
            )
    if node.get("type") == "BASE_TABLE":
        name = str(node.get("table_name", ""))
        if not _IDENTIFIER.match(name):
            raise RefusedQuery(f"table {name!r} is refused: query the tenant's views by name")
        if node.get("at_clause"):
            raise RefusedQuery(f"time travel on {name!r} is refused")
    for value in node.values():
        _check_tree(value)


def run_query(tc: TenantConnection, sql: str) -> tuple[list[str], list[tuple]]:
    """Run a checked query; returns the last statement's column names and rows."""
    check_query(tc, sql)
    result = None
    for statement in tc.con.extract_statements(sql):
        result = tc.con.execute(statement.query)
    assert result is not None
    columns = [d[0] for d in result.description or ()]
    return columns, result.fetchall()


# --- the second reader's check -------------------------------------------------------------------


@dataclass(frozen=True)
class ReadCheck:
    """One table read by DuckDB (delta-kernel) against its own Delta log as delta-rs reads it."""

    table: str
    view: str
    version: int | None
    duckdb_rows: int | None  # None when DuckDB could not read the table (`error`)
    log_rows: int | None  # None when some file's numRecords is missing from the log
    error: str | None = None

    @property
    def agrees(self) -> bool:
        if self.error is not None or self.duckdb_rows is None:
            return False
        return self.log_rows is None or self.duckdb_rows == self.log_rows


def second_reader_check(
    lake: Lake, tc: TenantConnection, tables: Iterable[str] | None = None
) -> list[ReadCheck]:
    """Row counts of the tenant's tables through DuckDB against the sum of the Delta log's
    per-file record counts (delta-rs). A table DuckDB cannot read is a finding (`error`), not a
    crash. `tables` limits it to those table names (a curated table is
    `gold.curated/<workarea_id>`; `gold.curated` means all of them)."""
    wanted = set(tables) if tables is not None else None
    found = []
    for view in tc.views.values():
        if view.uri is None:
            continue
        if wanted is not None and not (
            view.table in wanted or TableId.parse(view.table).spec_name in wanted
        ):
            continue
        table = lake.open(view.uri)
        if table is not None:
            found.append(_read_check(tc, view, table))
    return found


# A commit landing between the log read and DuckDB's read changes the counts under the check:
# it reads again (DuckDB's delta_scan has no version parameter to pin).
READ_CHECK_ATTEMPTS = 3


def _read_check(tc: TenantConnection, view: TenantView, table: Any) -> ReadCheck:
    for _ in range(READ_CHECK_ATTEMPTS):
        version = table.version()
        actions = pa.table(table.get_add_actions(flatten=True))
        counts = actions.column("num_records").to_pylist() if actions.num_rows else []
        log_rows = None if any(c is None for c in counts) else int(sum(counts))
        try:
            # sum(length(...)) makes DuckDB read every data file, where a bare count(*) could
            # be answered from the log's statistics alone.
            duck = int(
                tc.con.execute(
                    f"SELECT count(*), sum(length(tenant_id)) FROM {view.view}"
                ).fetchone()[0]
            )
        except duckdb.Error as error:
            return ReadCheck(view.table, view.view, version, None, log_rows, str(error))
        table.update_incremental()
        if table.version() == version:
            break
    return ReadCheck(view.table, view.view, version, duck, log_rows)


# --- the questions -------------------------------------------------------------------------------


def event_volume(tc: TenantConnection) -> list[dict[str, Any]]:
    """Bronze events per UTC day, event_type and provenance (NULL provenance as 'none')."""
    return tc.rows(
        "SELECT event_date, event_type, coalesce(provenance, 'none') AS provenance,"
        " count(*) AS events FROM bronze_events GROUP BY ALL ORDER BY ALL"
    )


def claims_by_state(tc: TenantConnection) -> list[dict[str, Any]]:
    """Silver claims per state, workarea (with its current path and status from gold.areas) and
    provenance."""
    return tc.rows(
        "SELECT c.state, c.workarea_id, a.path AS workarea_path, a.status AS workarea_status,"
        " c.provenance, count(*) AS claims"
        " FROM silver_claims c LEFT JOIN gold_areas a USING (workarea_id)"
        " GROUP BY ALL ORDER BY ALL"
    )


@dataclass
class LineageStats:
    """What gold.lineage says: edges per graph, label and state; the longest derivation chains
    (ratified claim edges labelled derives_from, followed from the derived claim to its
    sources); and per simulation its taint closure (silver rows with that simulation_id or
    carrying it in sim_derived_ids, live ones apart) and the lineage edges it marks."""

    edges: list[dict[str, Any]]
    longest_chain: int
    chains: list[dict[str, Any]]
    tainted: list[dict[str, Any]]


DERIVATION_LABEL = "derives_from"


def lineage_stats(tc: TenantConnection, top: int = 5) -> LineageStats:
    edges = tc.rows(
        "SELECT graph, edge_label, state, count(*) AS edges FROM gold_lineage"
        " GROUP BY ALL ORDER BY ALL"
    )
    links = tc.con.execute(
        "SELECT src_id || ':' || coalesce(src_version, 0), dst_id || ':' || coalesce(dst_version, 0)"
        " FROM gold_lineage WHERE graph = 'claim' AND state = 'ratified' AND edge_label = ?",
        [DERIVATION_LABEL],
    ).fetchall()
    lengths = longest_paths(links)
    chains = [
        {"claim": node, "chain_edges": length}
        for node, length in sorted(lengths.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        if length > 0
    ]
    tainted = tc.rows(
        "WITH sims AS ("
        "  SELECT simulation_id AS sim FROM silver_claims WHERE simulation_id IS NOT NULL"
        "  UNION SELECT unnest(sim_derived_ids) FROM silver_claims"
        "  UNION SELECT simulation_id FROM gold_lineage WHERE simulation_id IS NOT NULL)"
        " SELECT s.sim AS simulation_id,"
        "  (SELECT count(*) FROM silver_claims c WHERE c.simulation_id = s.sim"
        "     OR list_contains(coalesce(c.sim_derived_ids, []), s.sim)) AS closure_rows,"
        "  (SELECT count(*) FROM silver_claims c WHERE (c.simulation_id = s.sim"
        "     OR list_contains(coalesce(c.sim_derived_ids, []), s.sim))"
        "     AND c.state IN ('promoted', 'held')) AS closure_live,"
        "  (SELECT count(*) FROM gold_lineage l WHERE l.simulation_id = s.sim) AS edges,"
        "  (SELECT count(*) FROM gold_lineage l WHERE l.simulation_id = s.sim"
        "     AND l.state = 'ratified') AS edges_ratified"
        " FROM sims s ORDER BY closure_rows DESC, simulation_id"
    )
    return LineageStats(edges, max(lengths.values(), default=0), chains, tainted)


def longest_paths(links: Iterable[tuple[str, str]]) -> dict[str, int]:
    """For every node of a directed graph given as (from, to) links, the number of links on the
    longest path starting there. A cycle (which lineage should never have) is cut where the walk
    meets a node already on its path."""
    out: dict[str, list[str]] = {}
    nodes: set[str] = set()
    for src, dst in links:
        out.setdefault(src, []).append(dst)
        nodes.update((src, dst))
    length: dict[str, int] = {}
    for start in sorted(nodes):
        if start in length:
            continue
        # Iterative post-order walk; `on_path` guards against cycles.
        stack: list[tuple[str, int]] = [(start, 0)]
        on_path = {start}
        while stack:
            node, i = stack[-1]
            targets = out.get(node, [])
            if i < len(targets):
                stack[-1] = (node, i + 1)
                nxt = targets[i]
                if nxt not in length and nxt not in on_path:
                    stack.append((nxt, 0))
                    on_path.add(nxt)
                continue
            length[node] = max(
                (1 + length[t] for t in targets if t in length and t not in on_path - {node}),
                default=0,
            )
            on_path.discard(node)
            stack.pop()
    return length


# --- lake lag --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommitLag:
    """One writer commit of one table: when it landed, the batch it carried, and how long the
    batch's oldest op had waited in the outbox by then."""

    table: str
    version: int
    committed_at: dt.datetime
    batch_start: int
    batch_end: int
    oldest_op_at: dt.datetime | None  # None: no op of the tenant in the batch (txn-only)

    @property
    def lag_seconds(self) -> float | None:
        if self.oldest_op_at is None:
            return None
        return (self.committed_at - self.oldest_op_at).total_seconds()


def lake_lag(
    conn: psycopg.Connection, lake: Lake, tenant_id: str, tables: Iterable[tuple[str, str]]
) -> list[CommitLag]:
    """Every writer commit the tenant's tables' logs still hold (`tables`: (name, uri)), with its
    lag: commit time (the Delta commitInfo timestamp) minus the `oml.outbox.created_at` of the
    oldest of the tenant's ops in the batch (`oml.batch_start`, `oml.batch_end`]."""
    found: list[CommitLag] = []
    for name, uri in tables:
        table = lake.open(uri)
        if table is None:
            continue
        for entry in table.history():
            if "oml.batch_end" not in entry:
                continue  # maintenance commits carry no batch
            found.append(
                CommitLag(
                    table=name,
                    version=int(entry["version"]),
                    committed_at=dt.datetime.fromtimestamp(entry["timestamp"] / 1000, dt.UTC),
                    batch_start=int(entry["oml.batch_start"]),
                    batch_end=int(entry["oml.batch_end"]),
                    oldest_op_at=None,
                )
            )
    if not found:
        return []
    # One query: the oldest op of the tenant in each distinct batch.
    bounds = sorted({(c.batch_start, c.batch_end) for c in found})
    with tenant_scope(conn, tenant_id):
        rows = conn.execute(
            queries.OLDEST_OP_PER_BATCH,
            ([lo for lo, _ in bounds], [hi for _, hi in bounds], tenant_id),
        ).fetchall()
    oldest = {(lo, hi): at for lo, hi, at in rows}
    return sorted(
        (
            CommitLag(**{**c.__dict__, "oldest_op_at": oldest.get((c.batch_start, c.batch_end))})
            for c in found
        ),
        key=lambda c: (c.table, c.version),
    )


def lag_summary(commits: list[CommitLag]) -> list[dict[str, Any]]:
    """Per table: writer commits in the log, the latest commit's lag, the median and worst."""
    by_table: dict[str, list[CommitLag]] = {}
    for c in commits:
        by_table.setdefault(c.table, []).append(c)
    rows = []
    for table, cs in sorted(by_table.items()):
        lags = sorted(c.lag_seconds for c in cs if c.lag_seconds is not None)
        latest = max(cs, key=lambda c: c.version)
        rows.append(
            {
                "table": table,
                "commits": len(cs),
                "latest_version": latest.version,
                "latest_batch_end": latest.batch_end,
                "latest_lag_seconds": latest.lag_seconds,
                "median_lag_seconds": lags[len(lags) // 2] if lags else None,
                "max_lag_seconds": lags[-1] if lags else None,
            }
        )
    return rows


def txn_version(lake: Lake, uri: str) -> int | None:
    table = lake.open(uri)
    return None if table is None else table.transaction_version(APP_ID)


# --- the workarea tree at a past instant -----------------------------------------------------------

# The journal events of the area acts, and the op each one journals (DESIGN §2).
AREA_EVENTS = {
    "workarea.updated": "area.upsert",
    "workarea.reparented": "area.reparent",
    "workarea.validated": "area.validate",
}
AREA_COLUMNS = (
    "workarea_id",
    "parent_id",
    "path",
    "status",
    "crew_name",
    "crew_charter_uri",
    "crew_external_manager",
    "created_at",
    "updated_at",
)
# What an area event can set: every column but the key and the two instants.
_SETTABLE = tuple(c for c in AREA_COLUMNS if c not in ("workarea_id", "created_at", "updated_at"))


@dataclass
class AreaReplay:
    """The tree replayed from bronze up to `as_of`: rows by workarea_id, the events applied, and
    the area events skipped because the writer would have refused their op (`skipped`, with
    the reason), which gold.areas never shows either."""

    as_of: dt.datetime | None
    areas: dict[str, dict[str, Any]]
    events_applied: int
    last_journal_seq: int | None
    skipped: list[tuple[int, str]]


def parse_instant(text: str) -> dt.datetime:
    """An ISO date (the end of that UTC day: the tree as the day closed) or an ISO instant
    (naive means UTC)."""
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            day = dt.date.fromisoformat(text)
            return dt.datetime.combine(day, dt.time.max, dt.UTC)
        at = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an ISO date or instant: {text!r}") from None
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)


def _instant(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(dt.UTC)


def event_instant(event: dict[str, Any]) -> dt.datetime:
    """The act instant of an area event (its payload's `at`)."""
    return _instant(json.loads(event["payload"])["at"])


def area_events(tc: TenantConnection) -> list[dict[str, Any]]:
    """The tenant's journalled area events in chain order."""
    return tc.rows(
        "SELECT journal_seq, event_type, payload, outbox_seq FROM bronze_events"
        f" WHERE event_type IN ({', '.join(_sql_string(e) for e in AREA_EVENTS)})"
        " ORDER BY journal_seq"
    )


def replay_areas(
    events: Iterable[dict[str, Any]],
    as_of: dt.datetime | None = None,
    refused_journal_seqs: frozenset[int] = frozenset(),
) -> AreaReplay:
    """Fold area events (chain order) whose act instant (the payload's `at`) is at or before
    `as_of` (all when None) into the tree, by the op catalog's area rules. An upsert sets the
    given columns of one node: a new node needs path and status, one root, a known parent and a
    path one label below the parent's; it never moves a node, a validated node's status is
    frozen and no status moves down the ladder. A reparent moves a non-root node under a known
    parent outside its subtree, with a path one label below the parent's, and rewrites its
    subtree's paths. A validate sets a committed node validated. Acts the rules refuse are
    `skipped`; `refused_journal_seqs` are acts whose area ops the writer dead-lettered (from
    Postgres, when at hand), which covers refusals the rules cannot see from areas alone."""
    areas: dict[str, dict[str, Any]] = {}
    applied = 0
    last: int | None = None
    skipped: list[tuple[int, str]] = []
    for event in events:
        payload = json.loads(event["payload"])
        at = _instant(payload["at"])
        if as_of is not None and at > as_of:
            continue
        seq = int(event["journal_seq"])
        if seq in refused_journal_seqs:
            skipped.append((seq, "its area op was dead-lettered"))
            continue
        reason = _apply_area_event(areas, AREA_EVENTS[event["event_type"]], payload, at)
        if reason:
            skipped.append((seq, reason))
            continue
        applied += 1
        last = seq
    return AreaReplay(as_of, areas, applied, last, skipped)


_LADDER = {"development": 0, "committed": 1, "validated": 2}


def _path_refusal(areas: dict[str, dict[str, Any]], parent_id: str | None, path: str) -> str | None:
    """A path must extend the parent's current path by one label (the root's is one label)."""
    if parent_id is None:
        return "a root's path is one label" if "." in path else None
    head, _, label = path.rpartition(".")
    if head != areas[parent_id]["path"] or not label:
        return "the path does not extend the parent's path by one label"
    return None


def _apply_area_event(
    areas: dict[str, dict[str, Any]], op: str, payload: dict[str, Any], at: dt.datetime
) -> str | None:
    """Apply one area act; returns why it was skipped (the writer refuses that op), else None."""
    node_id = payload["workarea_id"]
    node = areas.get(node_id)
    if op == "area.upsert":
        return _upsert(areas, node_id, node, payload, at)
    if op == "area.reparent":
        parent = payload["parent_id"]
        if node is None:
            return "reparent of an unknown workarea"
        if node["parent_id"] is None:
            return "reparent of the root"
        if parent not in areas:
            return "reparent under an unknown parent"
        if parent == node_id or parent in area_descendants(areas.values(), node_id):
            return "reparent under its own subtree"
        refusal = _path_refusal(areas, parent, payload["path"])
        if refusal:
            return refusal
        paths = {node_id: payload["path"]}
        areas[node_id] = dict(node, parent_id=parent, path=payload["path"], updated_at=at)
        for child_id in area_descendants(areas.values(), node_id):
            child = areas[child_id]
            path = paths[child["parent_id"]] + "." + child["path"].rsplit(".", 1)[-1]
            paths[child_id] = path
            if path != child["path"]:
                areas[child_id] = dict(child, path=path, updated_at=at)
        return None
    if op == "area.validate":
        if node is None:
            return "validate of an unknown workarea"
        if node["status"] == "validated":
            return None
        if node["status"] != "committed":
            return "only a committed workarea is validated"
        areas[node_id] = dict(node, status="validated", updated_at=at)
        return None
    raise ValueError(f"not an area op: {op}")  # pragma: no cover - AREA_EVENTS names them all


def _upsert(
    areas: dict[str, dict[str, Any]],
    node_id: str,
    node: dict[str, Any] | None,
    payload: dict[str, Any],
    at: dt.datetime,
) -> str | None:
    given = {k: payload[k] for k in _SETTABLE if k in payload}
    if "created_at" in payload:
        given["created_at"] = _instant(payload["created_at"])
    if given.get("status") == "validated":
        return "validated is set by area.validate, not area.upsert"
    if given.get("status", "development") not in _LADDER:
        return f"unknown status {given['status']!r}"
    if node is None:
        if "path" not in given or "status" not in given:
            return "a new workarea needs path and status"
        parent = given.get("parent_id")
        if parent is None:
            if any(a["parent_id"] is None for a in areas.values()):
                return "a second root"
        elif parent == node_id:
            return "a workarea as its own parent"
        elif parent not in areas:
            return "a new workarea under an unknown parent"
        refusal = _path_refusal(areas, parent, given["path"])
        if refusal:
            return refusal
        node = {c: None for c in AREA_COLUMNS}
        node.update(workarea_id=node_id, created_at=at)
        areas[node_id] = dict(node, **given, updated_at=at)
        return None
    for column in ("parent_id", "path"):
        if column in given and given[column] != node[column]:
            return f"an upsert changing {column} (area.reparent moves workareas)"
    status = given.get("status", node["status"])
    if node["status"] == "validated" and status != "validated":
        return "a validated workarea's status is frozen"
    if _LADDER[status] < _LADDER[node["status"]]:
        return "a status move down the ladder"
    changed = dict(node, **given)
    if changed != node:
        areas[node_id] = dict(changed, updated_at=at)
    return None


def gold_areas(tc: TenantConnection) -> dict[str, dict[str, Any]]:
    """gold.areas now, by workarea_id, in the replay's columns."""
    return {
        row["workarea_id"]: row
        for row in tc.rows(f"SELECT {', '.join(AREA_COLUMNS)} FROM gold_areas")
    }


def area_differences(
    replayed: dict[str, dict[str, Any]], gold: dict[str, dict[str, Any]]
) -> list[str]:
    """What differs between a replayed tree and gold.areas, one line per node and column."""
    found = []
    for node in sorted(set(replayed) | set(gold)):
        mine, theirs = replayed.get(node), gold.get(node)
        if mine is None or theirs is None:
            found.append(f"{node}: only in {'gold.areas' if mine is None else 'the replay'}")
            continue
        for column in AREA_COLUMNS:
            if mine.get(column) != theirs.get(column):
                found.append(
                    f"{node} {column}: replay {mine.get(column)!r}, gold {theirs.get(column)!r}"
                )
    return found


def refused_area_acts(conn: psycopg.Connection, tenant_id: str) -> frozenset[int]:
    """journal_seqs of the tenant's acts none of whose area ops the writer applied (each one
    dead-lettered and not re-enqueued). An act that also carried a refused copy of a good op
    keeps its place: only acts with no applied area op are left out of a replay."""
    with tenant_scope(conn, tenant_id):
        return frozenset(js for (js,) in conn.execute(queries.REFUSED_AREA_ACTS, (tenant_id,)))
