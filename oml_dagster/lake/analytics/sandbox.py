"""One tenant's DuckDB connection: the tenant's tables as views (`bronze_events`, `silver_claims`,
`gold_lineage`, `gold_areas` and `curated_<workarea_id with '-' replaced by '_'>`), read through
DuckDB's Delta extension. A table that does not exist yet is an empty table of the spec's
columns, so every question has an answer. Locked down (`lockdown=True`, what the SQL shell
uses), the connection reads files only under the tenant's prefix and cannot change its
configuration: every analytics read and the SQL shell stay inside that sandbox."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import duckdb

from oml_dagster.lake.errors import LakeError
from oml_dagster.lake.model.tables import CORE_TABLES, GOLD_CURATED, TableId, TableSpec
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import tenant_tables
from oml_dagster.lake.store.sql import sql_text

# View name of each core table in a tenant's DuckDB connection.
VIEW_OF: dict[str, str] = {spec.name: spec.name.replace(".", "_") for spec in CORE_TABLES}
CURATED_VIEW_PREFIX = "curated_"


class AnalyticsError(LakeError):
    """The analytics engine could not be set up (e.g. the Delta extension is not installed)."""


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
    table: TableId
    spec: TableSpec
    uri: str | None


@dataclass
class TenantConnection:
    """One tenant's DuckDB connection, its views by name, and whether it is locked down."""

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

    def rows(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        """Rows of a query of this package's own (not user input) as dicts."""
        return _dicts(self.con.execute(sql, params or []))

    def value(self, sql: str, params: list[Any] | None = None) -> Any:
        """The first column of the one row a query of this package's own returns."""
        row = self.con.execute(sql, params or []).fetchone()
        if row is None:
            raise AnalyticsError(f"no row from {sql!r}")
        return row[0]


def _dicts(result: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    names = [d[0] for d in result.description or ()]
    return [dict(zip(names, row, strict=True)) for row in result.fetchall()]


def s3_secret(options: Mapping[str, str]) -> str:
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
            parts.append(f"{param} {sql_text(opts[option])}")
    endpoint = opts.get("AWS_ENDPOINT_URL") or opts.get("AWS_ENDPOINT")
    if endpoint:
        url = urlparse(endpoint)
        parts.append(f"ENDPOINT {sql_text(url.netloc or url.path)}")
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
        con.execute(f"LOAD {sql_text(extension_path('delta'))}")
        if not lake.is_local:
            con.execute(f"LOAD {sql_text(extension_path('httpfs'))}")
            con.execute(s3_secret(lake.storage_options))
        existing = {t.table: t.uri for t in tenant_tables(lake, tenant_id)}
        for spec in CORE_TABLES:
            core = TableId(spec.name)
            _register(found, VIEW_OF[spec.name], core, spec, existing.get(core))
        for table_id, uri in sorted(existing.items(), key=lambda kv: str(kv[0])):
            if table_id.spec_name == GOLD_CURATED.name and table_id.workarea_id is not None:
                _register(found, curated_view(table_id.workarea_id), table_id, GOLD_CURATED, uri)
        if lockdown:
            prefix = lake.tenant_uri(tenant_id).rstrip("/") + "/"
            con.execute(f"SET allowed_directories = [{sql_text(prefix)}]")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
            found.locked = True
    except BaseException:
        con.close()
        raise
    return found


def _register(
    found: TenantConnection, view: str, table: TableId, spec: TableSpec, uri: str | None
) -> None:
    con = found.con
    if uri is None:
        # No table yet: an empty table of the spec's columns answers every question with nothing.
        con.register("oml_empty", spec.schema.empty_table())
        con.execute(f"CREATE TABLE {view} AS SELECT * FROM oml_empty")
        con.unregister("oml_empty")
    else:
        con.execute(f"CREATE VIEW {view} AS SELECT * FROM delta_scan({sql_text(uri)})")
    found.views[view] = TenantView(view, table, spec, uri)
